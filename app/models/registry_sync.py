"""The model registry (a database table that the CLI, the console and other replicas change
while the server runs) kept in step with what the model pool serves: new entries served
(loaded on their first request), changed ones applied from their next load, removed ones
no longer served once nothing uses them. Re-read when a request names a model the pool does
not know yet, at most every REGISTRY_REFRESH_S."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from officellm.app.registry.entry import EMBED, GENERATE, RERANK, TRANSCRIBE, ModelEntry

if TYPE_CHECKING:
    from officellm.app.models.model_pool import ModelPool

# How often a request for an unknown name may re-read the registry (the CLI adds models to
# the database while the server runs).
REGISTRY_REFRESH_S = 2.0


class RegistrySync:
    """Applies the registry's entries to `pool`; `read` reads them (set when the pool
    starts)."""

    def __init__(self, pool: ModelPool) -> None:
        self.pool = pool
        self.read: Callable[[], list[ModelEntry]] = list
        self._last_refresh = 0.0

    async def refresh(self, force: bool = False) -> None:
        """Re-read the registry (at most every REGISTRY_REFRESH_S unless `force`)."""
        now = time.monotonic()
        if not force and now - self._last_refresh < REGISTRY_REFRESH_S:
            return
        self._last_refresh = now
        self.apply(await asyncio.to_thread(self.read))

    def apply(self, entries: list[ModelEntry]) -> None:
        """Serve the registry's entries: new ones are added (loaded on their first request);
        an entry's changes apply from its next load. Entries removed from the registry stop
        being served once nothing uses them (ModelPool.forget)."""
        pool = self.pool
        registered = {e.name: e for e in entries if e.kind == GENERATE}
        for model in list(pool.models[1:]):
            entry = registered.pop(model.entry.name, None)
            if entry is None:
                pool.forget(model)
            elif entry != model.entry:
                if entry.options != model.entry.options:
                    model.footprint = None  # planned again; the options apply from its next load
                pinned_now = entry.pinned and not model.entry.pinned
                model.entry = entry
                if pinned_now and not model.in_memory:
                    pool.load_pinned(model)
        for entry in registered.values():
            if pool.find(entry.name) is None and pool.find_embedder(entry.name) is None:
                pool.add(entry)
        encoders = {e.name: e for e in entries if e.kind == EMBED}
        for served in list(pool.embedders):
            if served.command_line:
                continue
            entry = encoders.pop(served.name, None)
            if entry is None:
                pool.forget_embedder(served)
            elif entry != served.entry:
                served.entry = entry
        for entry in encoders.values():
            if pool.find(entry.name) is None and pool.find_embedder(entry.name) is None:
                pool.add_embedder(entry)
        scorers = {e.name: e for e in entries if e.kind == RERANK}
        for reranker in list(pool.rerankers):
            entry = scorers.pop(reranker.name, None)
            if entry is None:
                pool.forget_reranker(reranker)
            elif entry != reranker.entry:
                reranker.entry = entry
        for entry in scorers.values():
            if not (pool.find(entry.name) or pool.find_embedder(entry.name)
                    or pool.find_transcriber(entry.name) or pool.find_reranker(entry.name)):
                pool.add_reranker(entry)
        self._apply_transcribers([e for e in entries if e.kind == TRANSCRIBE])

    def _apply_transcribers(self, entries: list[ModelEntry]) -> None:
        """The speech-to-text entries, applied as apply() does the others."""
        pool = self.pool
        registered = {e.name: e for e in entries}
        for served in list(pool.transcribers):
            entry = registered.pop(served.name, None)
            if entry is None:
                pool.forget_transcriber(served)
            elif entry != served.entry:
                served.entry = entry
        for entry in registered.values():
            if not (pool.find(entry.name) or pool.find_embedder(entry.name)
                    or pool.find_transcriber(entry.name) or pool.find_reranker(entry.name)):
                pool.add_transcriber(entry)
