"""Remembered settings, the `officellm admin` command, and the tray's menu."""

from __future__ import annotations

from PySide6.QtCore import QSettings

from officellm.admin_ui.console_settings import REMOTE, ConsoleSettings
from officellm.admin_ui.local_server import LocalServer
from officellm.admin_ui.main_window import MainWindow
from officellm.admin_ui.tray import ConsoleTray


def test_settings_round_trip(tmp_path):
    qs = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    s = ConsoleSettings(mode=REMOTE, model="/m/x.gguf", port=9123, extra_flags="--dtype float32",
                        remote_url="http://10.0.0.5:8000", token_file="/t/admin_token")
    s.save(qs)
    back = ConsoleSettings.load(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    assert back == s and isinstance(back.port, int)
    assert str(back.resolved_token_file()) == "/t/admin_token"
    assert ConsoleSettings(data_dir="/d").resolved_token_file().as_posix() == "/d/admin_token"


def test_cli_registers_admin():
    from officellm.cli import admin, build_parser

    args = build_parser().parse_args(["admin", "--url", "http://h:8000", "--token-file", "/t"])
    assert args.func is admin.run and args.url == "http://h:8000" and args.token_file == "/t"


def test_tray_menu_follows_server_state(qtbot, tmp_path):
    w = MainWindow(ConsoleSettings(data_dir=str(tmp_path / "srv")), LocalServer(tmp_path),
                   use_tray=False)
    qtbot.addWidget(w)
    tray = ConsoleTray(w, w.panel)
    w.panel.server_state.emit("running", "Running.")
    assert tray.toggle_action.text() == "Stop server"
    w.panel.server_state.emit("stopping", "…")
    assert not tray.toggle_action.isEnabled()
    w.panel.server_state.emit("stopped", "Stopped.")
    assert tray.toggle_action.text() == "Start server" and tray.toggle_action.isEnabled()
    tray.show_status("down", "Server down or unreachable")
    assert tray.status_action.text() == "Server down or unreachable"
    w.close()
