"""AsyncReranker: a rerank model on its own thread, fed from asyncio.

Like the AsyncEmbedder (engine/embedding/async_embedder.py): the pairs of concurrent requests
are scored together (the thread takes what is waiting, up to MAX_BATCH_PAIRS), the model
loads on that thread, the thread blocks when idle, and a failure is one sentence
(engine/batching_thread.py has what they share).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from officellm.engine.batching_thread import BatchingThread
from officellm.engine.model_lifecycle import EngineDeadError, LoadFailure
from officellm.engine.rerank.scorer import RerankerInfo, ScoredPair, Scorer

MAX_BATCH_PAIRS = 64


@dataclass
class RerankerStats:
    """Totals since start: requests, pairs scored, their tokens, batches run."""

    requests: int = 0
    pairs: int = 0
    tokens: int = 0
    batches: int = 0


@dataclass
class _Pair:
    query: str
    document: str
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class AsyncReranker(BatchingThread[_Pair, RerankerStats]):
    """Runs the scorer `factory` builds on a dedicated thread."""

    noun = "rerank model"
    load_noun = "rerank model"
    thread_name = "reranker"
    max_batch = MAX_BATCH_PAIRS
    item_noun = "pairs"

    def __init__(self, factory: Callable[[], Scorer],
                 on_load_failure: Callable[[LoadFailure], None] | None = None) -> None:
        super().__init__(RerankerStats(), on_load_failure)
        self._factory = factory
        self.scorer: Scorer | None = None

    @property
    def info(self) -> RerankerInfo:
        """Its input limit and scorer. EngineDeadError if it is not loaded."""
        scorer = self.scorer
        if scorer is None:
            raise EngineDeadError(self.unavailable_reason())
        return scorer.info

    # -- requests (event loop side) ------------------------------------------------------
    async def score(self, query: str, documents: list[str]) -> list[ScoredPair]:
        """Each document's relevance to `query`, in order; scored with whatever else is
        waiting. EngineDeadError if the model is not available."""
        self._check_ready()
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in documents]
        self._submit([_Pair(query, document, future, loop)
                      for document, future in zip(documents, futures, strict=True)])
        return list(await asyncio.gather(*futures))

    # -- the thread (BatchingThread's) ---------------------------------------------------
    def _load(self) -> None:
        self.scorer = self._factory()

    def _free(self) -> None:
        if self.scorer is not None:
            self.scorer.close()
        self.scorer = None

    def _run_batch(self, batch: list[_Pair]) -> bool:
        """Score a batch and answer its pairs (a failure fails this batch alone)."""
        assert self.scorer is not None
        try:
            scored = self.scorer.score([(p.query, p.document) for p in batch])
        except Exception as exc:
            self._fail_batch(batch, "Scoring", exc)
            return True
        with self._stats_lock:
            self._stats.pairs += len(batch)
            self._stats.tokens += sum(s.tokens for s in scored)
            self._stats.batches += 1
        self._answer(batch, scored)
        return True
