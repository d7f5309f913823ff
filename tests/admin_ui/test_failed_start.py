"""A local start that fails: the console's Start launches a real `officellm serve` whose KV pool
cannot hold one request; the server exits 1 with the refusal as its last line, and the
Server tab (and the banner) show that sentence, not just "exited"."""

from __future__ import annotations

import os

import pytest
from PySide6.QtCore import Qt

from officellm.admin_ui.console_settings import LOCAL, ConsoleSettings
from officellm.admin_ui.local_server import LocalServer, last_line
from officellm.admin_ui.main_window import MainWindow
from officellm.admin_ui.widgets.status_banner import DOWN
from tests.support.server_process import REPO, free_port, port_answers

START_TIMEOUT_MS = 180_000  # a fresh box dequantizes the GGUF and builds the kernels first
# SmolLM2-135M in float32: 16 MiB holds 352 tokens, far from one 8,192-token request.
FAILING_FLAGS = ["--dtype", "float32", "--kv-cache-dtype", "float32", "--kv-cache-memory", "16MiB",
                 "--max-model-len", "8192",
                 "--no-auth"]
REFUSAL_END = "the largest max_model_len that fits is 352."


@pytest.fixture
def server_pythonpath(monkeypatch):
    # The console passes its environment to the server; from a checkout it needs the repo.
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_last_line_skips_blank_lines() -> None:
    assert last_line("a\nb: the reason.\n\n  \n") == "b: the reason."
    assert last_line("") == ""


def test_server_tab_shows_why_the_start_failed(qtbot, console_data_dir, server_pythonpath):
    port = free_port()
    settings = ConsoleSettings(mode=LOCAL, port=port, data_dir=str(console_data_dir / "server"),
                               extra_flags=" ".join(FAILING_FLAGS))
    w = MainWindow(settings, LocalServer(console_data_dir / "console"), use_tray=False,
                   show_dialogs=False)
    qtbot.addWidget(w)
    w.show()

    qtbot.mouseClick(w.panel.start_button, Qt.MouseButton.LeftButton)
    assert w.panel.state == "starting"
    try:
        qtbot.waitUntil(lambda: w.panel.state != "starting", timeout=START_TIMEOUT_MS)
    finally:
        log = w.local.log_tail()
        if w.panel.state == "starting":  # never got past loading: show where it stands
            print(log)
            w.local.stop(timeout=15)
    assert w.panel.state == "failed", (w.panel.local_status.text(), log)
    assert w.local.exit_code == 1

    # The reason on the Server tab is the server's own last line: the refusal sentence.
    sentence = last_line(log)
    assert sentence.startswith("One request of max_model_len=8,192 tokens needs")
    assert REFUSAL_END in sentence and "INFO" not in sentence and "ERROR" not in sentence
    status = w.panel.local_status.text()
    assert status == f"The server did not start (exit code 1): {sentence}"
    assert w.tabs.tabText(w.tabs.indexOf(w.panel)) == "Server"
    assert sentence in w.panel.log_view.toPlainText()
    # The banner says the same, and keeps saying it while the poller finds nothing there.
    qtbot.waitUntil(lambda: w.banner.state == DOWN, timeout=10_000)
    assert sentence in w.banner.text()
    qtbot.wait(2500)
    assert sentence in w.banner.text() and not port_answers(port)

    # Start is offered again.
    assert w.panel.start_button.text() == "Start server" and w.panel.start_button.isEnabled()
    w.close()
