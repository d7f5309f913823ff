"""Fetch `/admin/stats` every second on a thread of its own, so the UI never waits on HTTP.

The poller owns its AdminClient on the worker thread; the UI only hands it a new URL and
token (under a lock) and listens to two signals: `snapshot` with a StatsSnapshot, or
`failed` with a sentence and the HTTP status (None when the server did not answer).
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

from officellm.admin_ui.admin_client import AdminClient, AdminError
from officellm.admin_ui.snapshot import StatsSnapshot


class StatsPoller(QObject):
    snapshot = Signal(object)  # StatsSnapshot
    failed = Signal(str, object)  # message, HTTP status or None

    def __init__(self, interval_ms: int = 1000) -> None:
        super().__init__()
        self.interval_ms = interval_ms
        self._lock = threading.Lock()
        self._target: tuple[str, str | None] | None = None
        self._generation = 0  # bumps on every set_target, so a stale answer is dropped
        self._client: AdminClient | None = None
        self._client_gen = -1
        self._thread = QThread()
        self._thread.setObjectName("stats-poller")
        self.moveToThread(self._thread)
        self._timer: QTimer | None = None
        self._thread.started.connect(self._begin)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop polling and join the thread (a request in flight finishes first, <= timeout)."""
        self._thread.quit()
        self._thread.wait(5000)

    def set_target(self, base_url: str | None, token: str | None) -> None:
        """Poll this server from now on (None: stop polling). Safe from any thread."""
        target = (base_url, token) if base_url else None
        with self._lock:
            if target == self._target:
                return  # unchanged: keep the client and any answer in flight
            self._target = target
            self._generation += 1

    @Slot()
    def _begin(self) -> None:
        self._timer = QTimer()
        self._timer.setInterval(self.interval_ms)
        self._timer.timeout.connect(self.poll_once)
        self._thread.finished.connect(self._end)
        self._timer.start()
        self.poll_once()

    @Slot()
    def _end(self) -> None:
        if self._timer:
            self._timer.stop()
        if self._client:
            self._client.close()
            self._client = None

    @Slot()
    def poll_once(self) -> None:
        with self._lock:
            target, gen = self._target, self._generation
        if target is None:
            return
        if self._client is None or self._client_gen != gen:
            if self._client:
                self._client.close()
            self._client = AdminClient(target[0], target[1])
            self._client_gen = gen
        try:
            data = self._client.stats()
        except AdminError as exc:
            if self._current(gen):
                self.failed.emit(str(exc), exc.status)
            return
        except ValueError as exc:  # not JSON: something else listens on that port
            if self._current(gen):
                self.failed.emit(f"{target[0]} did not answer with JSON: {exc}", None)
            return
        if self._current(gen):
            self.snapshot.emit(StatsSnapshot.from_json(data))

    def _current(self, gen: int) -> bool:
        with self._lock:
            return gen == self._generation
