"""One embedding model the server serves on /v1/embeddings: its embedder, its use (leases,
last use) and its idle sleep. Embedding models are small (all-MiniLM-L6-v2 is 90 MB), so the
memory budget does not plan them (docs/models.md)."""

from __future__ import annotations

from officellm.app.errors import unavailable
from officellm.app.models.served import Served
from officellm.app.registry.entry import ModelEntry
from officellm.app.server_settings import ServerSettings
from officellm.engine import AsyncEmbedder, EngineState


class ServedEmbedder(Served):
    """A registry entry of kind embed (or --embedding-model) and its AsyncEmbedder."""

    def __init__(self, entry: ModelEntry, embedder: AsyncEmbedder, settings: ServerSettings,
                 command_line: bool = False) -> None:
        super().__init__(entry, embedder, settings)
        self.command_line = command_line  # --embedding-model's, not the registry's
        self.embedder = embedder

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def leases(self) -> int:
        """Requests using it now."""
        return self.embedder.leases

    async def wake(self, retry_after_s: int) -> None:
        """Load it if it is out of memory (the request waits); 503 if that fails, or while
        the server starts and it loads."""
        self.touch()
        embedder = self.embedder
        if embedder.state is EngineState.SLEEPING or embedder.waking or embedder.restartable:
            if not await embedder.wake():
                raise unavailable(embedder.unavailable_reason(), retry_after_s)
            self.touch()
        if not embedder.is_ready:
            raise unavailable(embedder.unavailable_reason(), retry_after_s)
