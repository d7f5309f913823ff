"""AsyncReranker: a rerank model on its own thread, fed from asyncio.

Like the AsyncEmbedder (engine/embedding/async_embedder.py): the pairs of concurrent requests
are scored together (the thread takes what is waiting, up to MAX_BATCH_PAIRS), the model
loads on that thread, the thread blocks when idle, and a failure is one sentence.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from officellm.engine.model_lifecycle import (
    EngineDeadError,
    EngineState,
    LoadFailure,
    ModelLifecycle,
)
from officellm.engine.rerank.scorer import RerankerInfo, ScoredPair, Scorer

logger = logging.getLogger("officellm.reranker")

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


class _Stop:
    pass


class _Sleep:
    pass


class AsyncReranker(ModelLifecycle):
    """Runs the scorer `factory` builds on a dedicated thread."""

    noun = "rerank model"
    load_noun = "rerank model"
    thread_name = "reranker"

    def __init__(self, factory: Callable[[], Scorer],
                 on_load_failure: Callable[[LoadFailure], None] | None = None) -> None:
        super().__init__(on_load_failure)
        self._factory = factory
        self._pairs: queue.SimpleQueue[_Pair | _Stop | _Sleep] = queue.SimpleQueue()
        self.scorer: Scorer | None = None
        self._stats = RerankerStats()
        self._stats_lock = threading.Lock()
        self.leases = 0  # requests between their wake and their scores (event loop)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, asleep: bool = False) -> None:
        """Start the thread, which loads the model and then scores what comes; `asleep`:
        load nothing until the first wake()."""
        if self._thread is not None or self.state is EngineState.SLEEPING:
            return
        if asleep:
            self.state = EngineState.SLEEPING
            return
        self._start_thread()

    def sleep(self) -> bool:
        """Free the model (its thread ends) if no request is using it; True if it went to
        sleep. wake() loads it again."""
        if self.state is not EngineState.READY or self.leases:
            return False
        self.state = EngineState.SLEEPING  # rerank() refuses from now on, until wake()
        self._pairs.put(_Sleep())
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the pairs already queued."""
        if self._thread is not None:
            self._pairs.put(_Stop())
            self._thread.join(timeout)

    @property
    def info(self) -> RerankerInfo:
        """Its input limit and scorer. EngineDeadError if it is not loaded."""
        scorer = self.scorer
        if scorer is None:
            raise EngineDeadError(self.unavailable_reason())
        return scorer.info

    def stats(self) -> RerankerStats:
        with self._stats_lock:
            return RerankerStats(**vars(self._stats))

    # -- requests (event loop side) ------------------------------------------------------
    async def score(self, query: str, documents: list[str]) -> list[ScoredPair]:
        """Each document's relevance to `query`, in order; scored with whatever else is
        waiting. EngineDeadError if the model is not available."""
        if not self.is_ready:
            raise EngineDeadError(self.unavailable_reason())
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in documents]
        for document, future in zip(documents, futures, strict=True):
            self._pairs.put(_Pair(query, document, future, loop))
        with self._stats_lock:
            self._stats.requests += 1
        return list(await asyncio.gather(*futures))

    # -- the thread (ModelLifecycle's) ---------------------------------------------------
    def _load(self) -> None:
        self.scorer = self._factory()

    def _serve(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._score(batch)

    def _free(self) -> None:
        if self.scorer is not None:
            self.scorer.close()
        self.scorer = None

    def _after_stop(self) -> None:
        while True:
            try:
                item = self._pairs.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Pair):
                _settle(item, exception=EngineDeadError(self.unavailable_reason()))

    def _next_batch(self) -> list[_Pair] | None:
        """The first waiting pair (blocking), then what else waits, up to MAX_BATCH_PAIRS;
        None once stopped or put to sleep."""
        first = self._pairs.get()
        if isinstance(first, (_Stop, _Sleep)):
            return None
        batch = [first]
        while len(batch) < MAX_BATCH_PAIRS:
            try:
                item = self._pairs.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, (_Stop, _Sleep)):
                self._pairs.put(item)  # after this batch
                break
            batch.append(item)
        return batch

    def _score(self, batch: list[_Pair]) -> None:
        """Score a batch and answer its pairs (a failure fails this batch alone)."""
        assert self.scorer is not None
        try:
            scored = self.scorer.score([(p.query, p.document) for p in batch])
        except Exception as exc:
            logger.exception("Scoring a batch of %d pairs failed", len(batch))
            for item in batch:
                _settle(item, exception=RuntimeError(f"Scoring failed: {exc}"))
            return
        with self._stats_lock:
            self._stats.pairs += len(batch)
            self._stats.tokens += sum(s.tokens for s in scored)
            self._stats.batches += 1
        for item, result in zip(batch, scored, strict=True):
            _settle(item, result=result)


def _settle(item: _Pair, result: ScoredPair | None = None,
            exception: BaseException | None = None) -> None:
    def settle() -> None:
        if item.future.done():  # its request was cancelled (the client left)
            return
        if exception is not None:
            item.future.set_exception(exception)
        else:
            item.future.set_result(result)

    try:
        item.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the event loop has closed: nobody waits
        pass
