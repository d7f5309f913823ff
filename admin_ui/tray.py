"""The system-tray icon: the server's state at a glance, Start/Stop, and the window back."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QColor, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

_COLORS = {"up": "#2e9d46", "down": "#c9302c", "idle": "#8a8a8a"}


def dot_icon(color: str) -> QIcon:
    """A filled circle: the tray needs an icon and the console ships no image files."""
    pix = QPixmap(32, 32)
    pix.fill(Qt.GlobalColor.transparent)
    p = QPainter(pix)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    p.setBrush(QColor(color))
    p.setPen(QColor("#333333"))
    p.drawEllipse(3, 3, 26, 26)
    p.end()
    return QIcon(pix)


class ConsoleTray(QSystemTrayIcon):
    def __init__(self, window, panel) -> None:
        super().__init__(dot_icon(_COLORS["idle"]), window)
        self.window, self.panel = window, panel
        menu = QMenu()
        self.status_action = QAction("Not connected", menu)
        self.status_action.setEnabled(False)
        self.toggle_action = QAction("Start server", menu)
        self.toggle_action.triggered.connect(panel.toggle_server)
        show = QAction("Show console", menu)
        show.triggered.connect(self._show_window)
        quit_action = QAction("Quit console (server keeps running)", menu)
        quit_action.triggered.connect(window.close)
        for a in (self.status_action, self.toggle_action, show, quit_action):
            menu.addAction(a)
        self.menu = menu  # keep a reference: the tray does not own its menu
        self.setContextMenu(menu)
        self.activated.connect(lambda reason: reason == QSystemTrayIcon.ActivationReason.Trigger
                               and self._show_window())
        panel.server_state.connect(self._server_state)

    def _show_window(self) -> None:
        self.window.showNormal()
        self.window.raise_()
        self.window.activateWindow()

    def _server_state(self, state: str, _text: str) -> None:
        self.toggle_action.setText("Stop server" if state in ("running", "starting")
                                   else "Start server")
        self.toggle_action.setEnabled(state != "stopping")

    def show_status(self, level: str, text: str) -> None:
        self.setIcon(dot_icon(_COLORS.get(level, _COLORS["idle"])))
        self.status_action.setText(text[:80])
        self.setToolTip(f"officellm: {text}")
