"""A short history of stats snapshots: what the chart draws and the diagnosis rules read."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from officellm.admin_ui.snapshot import StatsSnapshot

# Ten minutes at one snapshot a second: enough for "the last minutes" on the chart and for
# per-minute rates, small enough to never matter for memory.
DEFAULT_MAX_AGE_S = 600.0


class StatsHistory:
    """Snapshots in arrival order, dropping those older than `max_age_s`."""

    def __init__(self, max_age_s: float = DEFAULT_MAX_AGE_S) -> None:
        self.max_age_s = max_age_s
        self._items: deque[StatsSnapshot] = deque()

    def add(self, snap: StatsSnapshot) -> None:
        # A restarted server starts its counters from zero again; mixing its snapshots with
        # the old server's would read as negative preemptions, so start the history afresh.
        if self._items and snap.uptime_s + 1e-6 < self._items[-1].uptime_s:
            self._items.clear()
        self._items.append(snap)
        while self._items and snap.received - self._items[0].received > self.max_age_s:
            self._items.popleft()

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[StatsSnapshot]:
        return iter(self._items)

    @property
    def latest(self) -> StatsSnapshot | None:
        return self._items[-1] if self._items else None

    def within(self, seconds: float) -> list[StatsSnapshot]:
        """The snapshots of the last `seconds` (by the console's clock)."""
        if not self._items:
            return []
        now = self._items[-1].received
        return [s for s in self._items if now - s.received <= seconds]

    def preemptions_in(self, seconds: float) -> int:
        """Preemptions counted over the last `seconds` (difference of the running total)."""
        window = self.within(seconds)
        if len(window) < 2:
            return 0
        return max(0, window[-1].engine.num_preemptions_total - window[0].engine.num_preemptions_total)
