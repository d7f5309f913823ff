"""Acceptance 2: Start really starts `officellm serve` (the port answers), Stop stops it (the
port refuses), and the console survives a server crash and says so; closing the console
leaves the server running and reopening reattaches."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from PySide6.QtCore import Qt

from officellm.admin_ui.admin_client import AdminClient, AdminError
from officellm.admin_ui.console_settings import LOCAL, ConsoleSettings, read_token_file
from officellm.admin_ui.local_server import LaunchConfig, LocalServer, ServerRecord, read_log_tail
from officellm.admin_ui.main_window import MainWindow
from officellm.admin_ui.widgets.status_banner import DOWN, UP
from officellm.loadgen.server_wait import wait_until_healthy
from tests.support.server_process import REPO, SMALL_POOL_FLAGS, free_port, port_answers

START_TIMEOUT_MS = 180_000


@pytest.fixture(scope="module")
def server_pythonpath():
    # The console passes its own environment to the server it starts; from a checkout the
    # server needs the repository on its path (an installed officellm would not).
    old = {k: os.environ.get(k) for k in ("PYTHONPATH", "OMP_NUM_THREADS")}
    os.environ["PYTHONPATH"] = str(REPO) + os.pathsep + (old["PYTHONPATH"] or "")
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_launch_config_argv():
    cfg = LaunchConfig(model="/m/x.gguf", port=9001, extra_flags="--max-model-len 4096 --dtype 'float32'")
    argv = cfg.argv()
    assert argv[1:] == ["-m", "officellm.cli", "serve", "/m/x.gguf", "--host", "127.0.0.1", "--port",
                        "9001", "--max-model-len", "4096", "--dtype", "float32"]
    assert cfg.base_url == "http://127.0.0.1:9001"
    assert cfg.admin_token_path() == cfg.resolved_data_dir() / "admin_token"
    cfg.extra_flags = "--db /srv/office/llm.db --port 1"
    assert str(cfg.admin_token_path()) == "/srv/office/admin_token"


def test_stale_state_file_is_forgotten(tmp_path):
    local = LocalServer(tmp_path)
    dead = ServerRecord(pid=2**22 + 12345, port=1, host="127.0.0.1", log_path="x",
                        data_dir=str(tmp_path), argv=["serve"], started=0.0)
    local.state_dir.mkdir(exist_ok=True)
    local.state_path.write_text(json.dumps(dead.__dict__))
    assert local.reattach() is None
    assert not local.state_path.exists()
    # A live pid that is not a server on that port (this test process) is not reattached.
    alive = dict(dead.__dict__, pid=os.getpid(), port=free_port())
    local.state_path.write_text(json.dumps(alive))
    assert local.reattach() is None


def test_start_refuses_a_busy_port(tmp_path):
    import socket

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        local = LocalServer(tmp_path)
        with pytest.raises(RuntimeError, match="already in use"):
            local.start(LaunchConfig(port=busy.getsockname()[1], data_dir=str(tmp_path)))
        assert local.record is None and not local.state_path.exists()
    finally:
        busy.close()


def test_log_tail_starts_at_a_line(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(5000)))
    tail = read_log_tail(log, max_bytes=100)
    assert tail.startswith("line ") and tail.endswith("line 4999\n")


def _has_admin_api(record: ServerRecord) -> bool:
    client = AdminClient(record.base_url, read_token_file(record.admin_token_path))
    try:
        client.stats()
    except AdminError as exc:
        if exc.status == 404:
            return False
        raise
    finally:
        client.close()
    return True


def _window(qtbot, data_dir, port) -> MainWindow:
    settings = ConsoleSettings(mode=LOCAL, port=port, data_dir=str(data_dir / "server"),
                               extra_flags=" ".join(SMALL_POOL_FLAGS + ["--no-auth"]))
    w = MainWindow(settings, LocalServer(data_dir / "console"), use_tray=False,
                   show_dialogs=False)
    qtbot.addWidget(w)
    w.show()
    return w


def test_start_crash_restart_stop_reattach(qtbot, console_data_dir, server_pythonpath):
    port = free_port()
    w = _window(qtbot, console_data_dir, port)
    assert w.panel.state == "stopped" and not port_answers(port)

    qtbot.mouseClick(w.panel.start_button, Qt.MouseButton.LeftButton)
    assert w.panel.state == "starting"
    record = w.local.record
    assert record is not None and record.port == port
    qtbot.waitUntil(lambda: port_answers(port), timeout=START_TIMEOUT_MS)
    wait_until_healthy(record.base_url, timeout=180)
    # The server runs in its own session: closing the console must not take it down.
    assert os.getsid(record.pid) == record.pid
    # The log tail reaches the UI.
    qtbot.waitUntil(lambda: "Uvicorn running" in w.panel.log_view.toPlainText(), timeout=10_000)
    # With the admin API, the console finds the token the server wrote and goes live.
    if _has_admin_api(record):
        qtbot.waitUntil(lambda: w.banner.state == UP, timeout=10_000)
        # The banner is up from the first answer, which may still say "loading"; the panel
        # says running at the first answer that says ready.
        qtbot.waitUntil(lambda: w.panel.state == "running", timeout=10_000)

    # Crash: kill -9 behind the console's back. It notices, says so, and keeps working.
    os.kill(record.pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: w.panel.state == "crashed", timeout=10_000)
    qtbot.waitUntil(lambda: w.banner.state == DOWN, timeout=10_000)
    assert "stopped unexpectedly" in w.banner.text()
    assert "exit code -9" in w.panel.local_status.text()
    assert not port_answers(port)
    w.tabs.setCurrentWidget(w.dashboard)  # the UI still responds
    qtbot.wait(1200)

    # Start again from the same button.
    qtbot.mouseClick(w.panel.start_button, Qt.MouseButton.LeftButton)
    pid2 = w.local.record.pid
    assert pid2 != record.pid
    qtbot.waitUntil(lambda: port_answers(port), timeout=START_TIMEOUT_MS)

    # Close the console: the server keeps serving; a new console reattaches to it.
    w.close()
    time.sleep(0.5)
    assert port_answers(port)
    w2 = _window(qtbot, console_data_dir, port)
    assert w2.local.record is not None and w2.local.record.pid == pid2
    assert w2.panel.state == "running"
    assert w2.panel.start_button.text() == "Stop server"

    # Stop from the reattached console: SIGTERM, the port refuses, the state file is gone.
    qtbot.mouseClick(w2.panel.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w2.panel.state == "stopped", timeout=60_000)
    assert not port_answers(port)
    assert not w2.local.state_path.exists()
    w2.close()
