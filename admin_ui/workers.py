"""Run a blocking call (an HTTP request, stopping a process) off the UI thread.

The result comes back through a Qt signal, so the callbacks run on the UI thread and may
touch widgets. A window that went away before the call finished simply drops the answer.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal


class _Relay(QObject):
    done = Signal(object)
    failed = Signal(object)


class Task(QRunnable):
    """fn() on the global thread pool; on_done(result) or on_error(exception) on the UI thread."""

    def __init__(self, fn: Callable[[], Any], on_done: Callable[[Any], None] | None = None,
                 on_error: Callable[[Exception], None] | None = None) -> None:
        super().__init__()
        self.fn = fn
        # The relay is made on the calling (UI) thread and lives there, so its signals, emitted
        # from the pool thread, are queued: the callbacks run on the UI thread.
        self.relay = _Relay()
        if on_done:
            self.relay.done.connect(on_done)
        if on_error:
            self.relay.failed.connect(on_error)

    def run(self) -> None:
        try:
            result = self.fn()
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the UI
            exc.traceback_text = traceback.format_exc()  # type: ignore[attr-defined]
            self.relay.failed.emit(exc)
        else:
            self.relay.done.emit(result)


_live: set[Task] = set()


def run_async(fn: Callable[[], Any], on_done: Callable[[Any], None] | None = None,
              on_error: Callable[[Exception], None] | None = None) -> Task:
    """Start fn on the global pool and return the task (kept alive until it has answered)."""
    task = Task(fn, on_done, on_error)
    task.setAutoDelete(False)
    _live.add(task)
    task.relay.done.connect(lambda _=None: _live.discard(task))
    task.relay.failed.connect(lambda _=None: _live.discard(task))
    QThreadPool.globalInstance().start(task)
    return task
