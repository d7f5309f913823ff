"""A banner across the top of the window: green while the server answers, red when it is
down or unreachable, so nobody reads stale numbers as live ones."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel

UP, DOWN, IDLE = "up", "down", "idle"
_STYLE = {
    UP: "background:#d3f0d8; color:#124d1f;",
    DOWN: "background:#f5c6cb; color:#721c24; font-weight:bold;",
    IDLE: "background:#e2e3e5; color:#383d41;",
}


class StatusBanner(QLabel):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setWordWrap(True)
        self.setMargin(6)
        self.state = IDLE
        self.show_state(IDLE, "Not connected.")

    def show_state(self, state: str, text: str) -> None:
        self.state = state
        self.setText(text)
        self.setStyleSheet(f"QLabel {{ {_STYLE[state]} border-radius:4px; }}")
