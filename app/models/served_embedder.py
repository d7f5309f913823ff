"""One embedding model the server serves on /v1/embeddings: its embedder, its use (leases,
last use) and its idle sleep. Embedding models are small (all-MiniLM-L6-v2 is 90 MB), so the
memory budget does not plan them (docs/models.md)."""

from __future__ import annotations

import time
from datetime import datetime, timezone

from officellm.app.errors import unavailable
from officellm.app.models.served_model import UNLOADED
from officellm.app.registry.entry import ModelEntry
from officellm.app.server_settings import ServerSettings
from officellm.engine import AsyncEmbedder, EngineState


class ServedEmbedder:
    """A registry entry of kind embed (or --embedding-model) and its AsyncEmbedder."""

    def __init__(self, entry: ModelEntry, embedder: AsyncEmbedder, settings: ServerSettings,
                 command_line: bool = False) -> None:
        self.entry = entry
        self.command_line = command_line  # --embedding-model's, not the registry's
        self.embedder = embedder
        self.settings = settings
        self.last_used = time.monotonic()
        self.last_used_at: datetime | None = None
        self.resting = UNLOADED

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def state(self) -> str:
        """unloaded, sleeping, loading, ready, failed or stopped."""
        embedder = self.embedder
        if embedder.waking:
            return "loading"
        if embedder.state is EngineState.SLEEPING:
            return "failed" if embedder.error is not None else self.resting
        if embedder.state is EngineState.DEAD:
            return "failed"
        return embedder.state.value

    @property
    def idle_seconds(self) -> float | None:
        """Its entry's idle time, else the server's --sleep-idle-seconds; None: never."""
        own = self.entry.sleep_idle_seconds
        if own is not None:
            return own or None
        return self.settings.sleep_idle_seconds

    def touch(self) -> None:
        self.last_used = time.monotonic()
        self.last_used_at = datetime.now(timezone.utc)

    async def wake(self, retry_after_s: int) -> None:
        """Load it if it is out of memory (the request waits); 503 if that fails, or while
        the server starts and it loads."""
        self.touch()
        embedder = self.embedder
        if embedder.state is EngineState.SLEEPING or embedder.waking:
            if not await embedder.wake():
                raise unavailable(embedder.unavailable_reason(), retry_after_s)
            self.touch()
        if not embedder.is_ready:
            raise unavailable(embedder.unavailable_reason(), retry_after_s)
