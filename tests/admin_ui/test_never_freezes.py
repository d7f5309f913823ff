"""The UI thread never waits on the network: a server that accepts connections but never
answers (hung, or a black-holed link) leaves the window responsive and the banner says so."""

from __future__ import annotations

import socket
import time

from PySide6.QtCore import QTimer

from officellm.admin_ui.console_settings import REMOTE, ConsoleSettings
from officellm.admin_ui.local_server import LocalServer
from officellm.admin_ui.main_window import MainWindow
from officellm.admin_ui.widgets.status_banner import DOWN


def test_hung_server_does_not_freeze_the_window(qtbot, tmp_path):
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)  # connections complete in the backlog; nobody ever reads or answers
    url = f"http://127.0.0.1:{hung.getsockname()[1]}"
    token = tmp_path / "admin_token"
    token.write_text("ocl-admin-test\n")
    w = MainWindow(ConsoleSettings(mode=REMOTE, remote_url=url, token_file=str(token)),
                   LocalServer(tmp_path / "console"), use_tray=False)
    qtbot.addWidget(w)
    w.show()

    gaps: list[float] = []
    last = [time.monotonic()]

    def tick() -> None:
        now = time.monotonic()
        gaps.append(now - last[0])
        last[0] = now

    timer = QTimer()
    timer.setInterval(50)
    timer.timeout.connect(tick)
    timer.start()
    try:
        # The client's timeout is 3 s: by then the banner must say the server is not answering.
        qtbot.waitUntil(lambda: w.banner.state == DOWN, timeout=8000)
        assert "unreachable" in w.banner.text() and url in w.banner.text()
        qtbot.wait(1000)
    finally:
        timer.stop()
        w.close()
        hung.close()
    assert len(gaps) > 40
    assert max(gaps) < 0.5, f"the UI thread stalled for {max(gaps):.2f} s"
