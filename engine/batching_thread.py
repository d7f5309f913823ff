"""BatchingThread: a side model (embedder, reranker, transcriber) on its own thread, fed
from asyncio through one queue.

Requests put their work items on the queue; the thread takes the first (blocking, so an
idle model costs no CPU) and whatever else is waiting into one batch, so concurrent
requests cost about one forward pass, not one each. The lifecycle (load on the thread,
sleep, wake, stop, crash) is ModelLifecycle's; this adds what every batching side model
shares on top of it, so each subclass says only what an item is, which items may share a
batch, how a batch runs, and its stats."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from officellm.engine.model_lifecycle import (
    EngineDeadError,
    EngineState,
    LoadFailure,
    ModelLifecycle,
)

logger = logging.getLogger("officellm.batching_thread")


class WorkItem(Protocol):
    """One unit of a request's work: its answer goes to `future`, on `loop`."""

    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class RequestStats(Protocol):
    """A side model's totals: each counts its requests, and the rest is its own."""

    requests: int


ItemT = TypeVar("ItemT", bound=WorkItem)
StatsT = TypeVar("StatsT", bound=RequestStats)


class _Stop:
    """Stop after what is queued before this marker."""


class _Sleep:
    """Free the model after what is queued before this marker (ModelLifecycle's sleep)."""


@dataclass
class _Died:
    """The model's process went untold (it was watched, e.g. Encoder.watch)."""

    cause: str


class Joining(enum.Enum):
    """What _joins says of an item: TAKEN into the batch; LATER (it waits for a later
    batch, and others may still join this one); FULL (it waits, and this batch is done)."""

    TAKEN = "taken"
    LATER = "later"
    FULL = "full"


class BatchingThread(ModelLifecycle, Generic[ItemT, StatsT]):
    """A ModelLifecycle that serves one queue of `ItemT`s in batches of up to `max_batch`.
    A subclass loads and frees its model (`_load`, `_free`), may refuse an item a place in
    a batch (`_joins`), and runs a batch (`_run_batch`)."""

    max_batch = 64
    item_noun = "items"  # what an item is, for the log

    def __init__(self, stats: StatsT,
                 on_load_failure: Callable[[LoadFailure], None] | None) -> None:
        super().__init__(on_load_failure)
        self._queue: queue.SimpleQueue[ItemT | _Stop | _Sleep | _Died] = queue.SimpleQueue()
        self._stats = stats
        self._stats_lock = threading.Lock()  # the thread counts batches, requests their own
        # Requests between their wake and their last answer (event loop): sleep() waits
        # for none, so a model is not freed under a request that has woken it.
        self.leases = 0

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, asleep: bool = False) -> None:
        """Start the thread, which loads the model and then serves what comes; `asleep`:
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
        self.state = EngineState.SLEEPING  # requests are refused from now on, until wake()
        self._queue.put(_Sleep())
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the items already queued."""
        if self._thread is not None:
            self._queue.put(_Stop())
            self._thread.join(timeout)

    def stats(self) -> StatsT:
        """A copy of the totals since start."""
        with self._stats_lock:
            return dataclasses.replace(self._stats)  # type: ignore[type-var]

    # -- requests (event loop side) ------------------------------------------------------
    def _check_ready(self) -> None:
        """EngineDeadError, in a sentence for the client, unless the model is serving."""
        if not self.is_ready:
            raise EngineDeadError(self.unavailable_reason())

    def _submit(self, items: list[ItemT]) -> None:
        """Queue one request's items, in order, and count the request."""
        for item in items:
            self._queue.put(item)
        with self._stats_lock:
            self._stats.requests += 1

    def _model_died(self, cause: str) -> None:
        """The model's process went untold (any thread): the thread fails what waits, and
        the next request starts it again."""
        self._queue.put(_Died(cause))

    # -- the subclass's ------------------------------------------------------------------
    def _joins(self, batch: list[ItemT], item: ItemT) -> Joining:
        """Whether `item` may join `batch` (which holds at least one item)."""
        return Joining.TAKEN

    def _run_batch(self, batch: list[ItemT]) -> bool:
        """Run `batch` and answer its items (_answer, _fail_batch); False if the model
        stopped untold (after crashed()), which ends the thread."""
        raise NotImplementedError

    # -- the thread (ModelLifecycle's) ---------------------------------------------------
    def _serve(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None or not self._run_batch(batch):
                return

    def _after_stop(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if not isinstance(item, (_Stop, _Sleep, _Died)):
                settle(item, exception=EngineDeadError(self.unavailable_reason()))

    def _next_batch(self) -> list[ItemT] | None:
        """The first waiting item (blocking), then what else waits and joins it, up to
        `max_batch`; None once stopped, asleep or died. Items that do not join, and a
        marker, wait for later, in their order."""
        first = self._queue.get()
        if isinstance(first, _Died):
            logger.error("The %s stopped: %s", self.load_noun, first.cause)
            self.crashed(first.cause)
            return None
        if isinstance(first, (_Stop, _Sleep)):
            return None
        batch: list[ItemT] = [first]
        later: list[ItemT | _Stop | _Sleep | _Died] = []
        while len(batch) < self.max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, (_Stop, _Sleep, _Died)):
                later.append(item)  # after this batch
                break
            joining = self._joins(batch, item)
            if joining is Joining.TAKEN:
                batch.append(item)
                continue
            later.append(item)
            if joining is Joining.FULL:
                break
        for item in later:
            self._queue.put(item)
        return batch

    def _answer(self, batch: list[ItemT], results: list[Any]) -> None:
        """Give each item of `batch` its result, in order."""
        for item, result in zip(batch, results, strict=True):
            settle(item, result=result)

    def _fail_batch(self, batch: list[ItemT], what: str, exc: Exception) -> None:
        """A batch failed: log it with its traceback and fail its items with one sentence
        ("`what` failed: why"); the next batch is tried afresh."""
        logger.exception("A batch of %d %s failed", len(batch), self.item_noun)
        for item in batch:
            settle(item, exception=RuntimeError(f"{what} failed: {exc}"))

    def _fail_with(self, batch: list[ItemT], exception: BaseException) -> None:
        """Fail every item of `batch` with `exception`."""
        for item in batch:
            settle(item, exception=exception)


def settle(item: WorkItem, result: object = None,
           exception: BaseException | None = None) -> None:
    """Answer `item` on its event loop (from the thread): its result, or `exception`."""
    def settle_on_loop() -> None:
        if item.future.done():  # its request was cancelled (the client left)
            return
        if exception is not None:
            item.future.set_exception(exception)
        else:
            item.future.set_result(result)

    try:
        item.loop.call_soon_threadsafe(settle_on_loop)
    except RuntimeError:  # the event loop has closed: nobody waits
        pass
