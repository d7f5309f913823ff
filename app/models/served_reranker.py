"""One rerank model the server serves on /v1/rerank, /v2/rerank and /score: its reranker,
its use (leases, last use) and its idle sleep, served as embedding models are (ServedEmbedder):
loaded on its first request, asleep when idle, not planned in the memory budget (a
cross-encoder is tens of MB; a decoder reranker's engine takes the KV pool its entry's
kv_cache_memory names, 1 GiB unless told)."""

from __future__ import annotations

from officellm.app.errors import unavailable
from officellm.app.models.served import Served
from officellm.app.registry.entry import ModelEntry
from officellm.app.server_settings import ServerSettings
from officellm.engine import AsyncReranker, EngineState


class ServedReranker(Served):
    """A registry entry of kind rerank and its AsyncReranker."""

    def __init__(self, entry: ModelEntry, reranker: AsyncReranker,
                 settings: ServerSettings) -> None:
        super().__init__(entry, reranker, settings)
        self.reranker = reranker

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def leases(self) -> int:
        """Requests using it now."""
        return self.reranker.leases

    async def wake(self, retry_after_s: int) -> None:
        """Load it if it is out of memory (the request waits); 503 if that fails."""
        self.touch()
        reranker = self.reranker
        if reranker.state is EngineState.SLEEPING or reranker.waking or reranker.restartable:
            if not await reranker.wake():
                raise unavailable(reranker.unavailable_reason(), retry_after_s)
            self.touch()
        if not reranker.is_ready:
            raise unavailable(reranker.unavailable_reason(), retry_after_s)
