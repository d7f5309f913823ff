"""One StatsWindow per served model, by name: /admin/stats' rates and latencies per model (its
top-level ones are the default model's)."""

from __future__ import annotations

import threading

from officellm.app.observability.stats_window import StatsWindow


class ModelWindows:
    """The recent-history windows of every model that has reported (thread-safe: latency
    arrives on the event loop, readers may be worker threads)."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._lock = threading.Lock()
        self._windows: dict[str, StatsWindow] = {}

    def of(self, model: str) -> StatsWindow:
        """`model`'s window, made empty on first use (a model that has not served yet reads
        zero rates and no percentiles)."""
        with self._lock:
            window = self._windows.get(model)
            if window is None:
                window = self._windows[model] = StatsWindow(self.window_s)
            return window
