"""What every served model shares, generate or embed: its registry entry, its engine's
lifecycle (engine/model_lifecycle.py) read as the admin's state, its last use (the idle
clock and the LRU order) and its idle time."""

from __future__ import annotations

import time
from datetime import datetime, timezone

from officellm.app.registry.entry import ModelEntry
from officellm.app.server_settings import ServerSettings
from officellm.engine import EngineState, ModelLifecycle

# A model out of memory: never loaded or unloaded (to make room, or by the admin), or put to
# sleep by --sleep-idle-seconds. Both load on the next request.
UNLOADED, SLEEPING = "unloaded", "sleeping"


class Served:
    """A registry entry and the lifecycle of what serves it."""

    def __init__(self, entry: ModelEntry, lifecycle: ModelLifecycle,
                 settings: ServerSettings) -> None:
        self.entry = entry
        self.lifecycle = lifecycle
        self.settings = settings
        self.last_used = time.monotonic()
        self.last_used_at: datetime | None = None
        self.resting = UNLOADED  # what it is while out of memory: unloaded or sleeping

    @property
    def state(self) -> str:
        """unloaded, sleeping, loading, ready, failed or stopped."""
        lifecycle = self.lifecycle
        if lifecycle.waking:
            return "loading"
        if lifecycle.state is EngineState.SLEEPING:
            return "failed" if lifecycle.error is not None else self.resting
        if lifecycle.state is EngineState.DEAD:
            return "failed"
        return lifecycle.state.value

    @property
    def idle_seconds(self) -> float | None:
        """--sleep-idle-seconds for this model: its entry's, else the server's; None: never."""
        own = self.entry.sleep_idle_seconds
        if own is not None:
            return own or None
        return self.settings.sleep_idle_seconds

    def touch(self) -> None:
        """It was used now (the idle clock and the LRU order restart)."""
        self.last_used = time.monotonic()
        self.last_used_at = datetime.now(timezone.utc)
