"""What observability reads of the engine: its latest stats snapshot.

A Protocol rather than the serving layer's AsyncEngine, so that observability (which the
serving layer records into) never imports serving back; AsyncEngine is the one source.
"""

from __future__ import annotations

from typing import Protocol

from engine import EngineStats


class StatsSource(Protocol):
    """The engine's counters and gauges as of its last step."""

    def stats(self) -> EngineStats | None:
        """The latest snapshot; None while the engine is still loading."""
        ...
