"""Start the console: `officellm admin` or `python -m admin_ui.app`."""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None, url: str | None = None,
         token_file: str | None = None) -> int:
    try:
        from PySide6.QtWidgets import QApplication
    except ImportError:
        print("officellm admin needs the GUI extras: pip install 'officellm[gui]'",
              file=sys.stderr)
        return 2
    from officellm.admin_ui.qt_platform import xcb_problem

    problem = xcb_problem(os.environ)
    if problem is not None:  # instead of Qt's abort, which names no package
        print(problem, file=sys.stderr)
        return 2
    from officellm.admin_ui.console_settings import REMOTE, ConsoleSettings
    from officellm.admin_ui.main_window import MainWindow

    app = QApplication.instance() or QApplication(argv or sys.argv[:1])
    app.setOrganizationName("officellm")
    app.setApplicationName("officellm-admin")
    # Closing the window hides the tray too; the server is independent of both.
    app.setQuitOnLastWindowClosed(True)
    settings = ConsoleSettings.load()
    if url:
        settings.mode, settings.remote_url = REMOTE, url
    if token_file:
        settings.token_file = token_file
    window = MainWindow(settings)
    window.show()
    _quit_on_ctrl_c(app, window)
    return app.exec()


def _quit_on_ctrl_c(app, window) -> None:
    """Ctrl+C in the terminal closes the window properly (settings saved, poller joined).
    Qt's loop never returns to Python on its own, so a timer lets the handler run."""
    import signal

    from PySide6.QtCore import QTimer

    signal.signal(signal.SIGINT, lambda *_: window.close())
    timer = QTimer(app)
    timer.timeout.connect(lambda: None)
    timer.start(250)


if __name__ == "__main__":
    sys.exit(main())
