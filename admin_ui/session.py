"""The server the console is talking to now, and a way to call it off the UI thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal

from officellm.admin_ui.admin_client import AdminClient
from officellm.admin_ui.workers import Task, run_async


class AdminSession(QObject):
    """Holds the URL and admin token; tabs call `call(fn, on_done, on_error)` with fn taking
    an AdminClient. `changed` fires when the console switches server or token."""

    changed = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.base_url: str | None = None
        self.token: str | None = None

    def set_target(self, base_url: str | None, token: str | None) -> None:
        if (base_url, token) != (self.base_url, self.token):
            self.base_url, self.token = base_url, token
            self.changed.emit()

    @property
    def connected(self) -> bool:
        return self.base_url is not None

    def call(self, fn: Callable[[AdminClient], Any], on_done: Callable[[Any], None] | None = None,
             on_error: Callable[[Exception], None] | None = None) -> Task | None:
        """Run fn(client) on a worker thread; None when there is no server to talk to."""
        if self.base_url is None:
            return None
        url, token = self.base_url, self.token

        def work() -> Any:
            client = AdminClient(url, token)
            try:
                return fn(client)
            finally:
                client.close()

        return run_async(work, on_done, on_error)
