"""AsyncEmbedder: an embedding model on its own thread, fed from asyncio.

Inputs from concurrent requests are encoded together: the thread takes what is waiting (up
to MAX_BATCH_INPUTS inputs and MAX_BATCH_TOKENS padded tokens) into one forward pass, so ten
people's document chunks cost about one pass, not ten. Like AsyncLLM, it loads the model on
that thread, blocks when idle (no CPU), and a failure is one sentence for the operator.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from officellm.engine.core_client.core_client import EngineCoreDied
from officellm.engine.embedding.encoders import Encoder
from officellm.engine.embedding.sentence_encoder import EncoderInfo
from officellm.engine.model_lifecycle import (
    EngineDeadError,
    EngineState,
    LoadFailure,
    ModelLifecycle,
)

logger = logging.getLogger("officellm.embedder")

MAX_BATCH_INPUTS = 64
MAX_BATCH_TOKENS = 16_384  # inputs x the longest one's tokens (the padded batch)


@dataclass
class EmbedderStats:
    """Totals since start: requests, inputs encoded, their tokens, forward passes."""

    requests: int = 0
    inputs: int = 0
    tokens: int = 0
    batches: int = 0


@dataclass
class _Input:
    ids: list[int]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class _Stop:
    pass


class _Sleep:
    pass


@dataclass
class _Died:
    """The encoder's process went untold (Encoder.watch)."""

    cause: str


class AsyncEmbedder(ModelLifecycle):
    """Runs the encoder `factory` builds on a dedicated thread."""

    noun = "embedding model"
    load_noun = "embedding model"
    thread_name = "embedder"

    def __init__(self, factory: Callable[[], Encoder],
                 on_load_failure: Callable[[LoadFailure], None] | None = None) -> None:
        # on_load_failure: `officellm serve` stops, as for the chat model: a server asked to
        # embed that cannot is not half-started.
        super().__init__(on_load_failure)
        self._factory = factory
        self._inputs: queue.SimpleQueue[_Input | _Stop | _Sleep | _Died] = queue.SimpleQueue()
        self.encoder: Encoder | None = None
        self._stats = EmbedderStats()
        self._stats_lock = threading.Lock()
        self.leases = 0  # requests between their tokenizing and their vectors (event loop)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, asleep: bool = False) -> None:
        """Start the thread, which loads the model and then encodes what comes; `asleep`:
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
        self.state = EngineState.SLEEPING  # embed() refuses from now on, until wake()
        self._inputs.put(_Sleep())
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the inputs already queued."""
        if self._thread is not None:
            self._inputs.put(_Stop())
            self._thread.join(timeout)

    @property
    def model_dir(self) -> Path:
        """The model's directory (only once ready)."""
        assert self.encoder is not None, "only once the embedder is ready"
        return self.encoder.model_dir

    @property
    def info(self) -> EncoderInfo:
        """Its dimensions and input limit. EngineDeadError if it is not loaded (its process
        may have died since the request woke it)."""
        encoder = self.encoder
        if encoder is None:
            raise EngineDeadError(self.unavailable_reason())
        return encoder.info

    def stats(self) -> EmbedderStats:
        with self._stats_lock:
            return EmbedderStats(**vars(self._stats))

    # -- requests (event loop side) ------------------------------------------------------
    def tokenize(self, text: str, max_length: int | None = None) -> list[int]:
        """`text`'s ids as the model encodes them, all or the first `max_length`.
        EngineDeadError if it is not loaded, or its process dies meanwhile."""
        encoder = self.encoder
        if encoder is None:
            raise EngineDeadError(self.unavailable_reason())
        try:
            return encoder.tokenize(text, max_length)
        except EngineCoreDied as exc:
            raise EngineDeadError(f"The {self.load_noun} stopped: {exc}") from exc

    async def embed(self, inputs: list[list[int]],
                    dimensions: int | None = None) -> list[list[float]]:
        """One vector per input (token ids, each within the model's limit), in order; batched
        with whatever else is waiting. `dimensions`: its first that many values (the caller
        checks the model was trained for them), renormalised if the model's vectors have
        unit length. EngineDeadError if the model is not available."""
        if not self.is_ready:
            raise EngineDeadError(self.unavailable_reason())
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in inputs]
        for ids, future in zip(inputs, futures, strict=True):
            self._inputs.put(_Input(ids, future, loop))
        with self._stats_lock:
            self._stats.requests += 1
        vectors: list[torch.Tensor] = list(await asyncio.gather(*futures))
        if dimensions is not None:
            vectors = [v[:dimensions] for v in vectors]
            if self.info.normalized:
                vectors = [torch.nn.functional.normalize(v, dim=0) for v in vectors]
        return [v.tolist() for v in vectors]

    # -- the thread ----------------------------------------------------------------------
    # -- the thread (ModelLifecycle's) ---------------------------------------------------
    def _load(self) -> None:
        self.encoder = self._factory()
        self.encoder.watch(lambda cause: self._inputs.put(_Died(cause)))

    def _serve(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            if not self._encode(batch):
                return

    def _free(self) -> None:
        if self.encoder is not None:
            self.encoder.close()
        self.encoder = None

    def _after_stop(self) -> None:
        self._fail_waiting()

    def _next_batch(self) -> list[_Input] | None:
        """The first waiting input (blocking), then what else waits, within the limits;
        None once stopped."""
        first = self._inputs.get()
        if isinstance(first, _Died):
            logger.error("The embedding model stopped: %s", first.cause)
            self.crashed(first.cause)
            return None
        if isinstance(first, (_Stop, _Sleep)):
            return None
        batch, longest = [first], len(first.ids)
        while len(batch) < MAX_BATCH_INPUTS:
            try:
                item = self._inputs.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, (_Stop, _Sleep, _Died)):
                self._inputs.put(item)  # after this batch
                break
            if max(longest, len(item.ids)) * (len(batch) + 1) > MAX_BATCH_TOKENS:
                self._inputs.put(item)  # the next batch's (order among inputs is not promised)
                break
            batch.append(item)
            longest = max(longest, len(item.ids))
        return batch

    def _encode(self, batch: list[_Input]) -> bool:
        """Encode a batch and answer its inputs; False if the encoder's process died (the
        batch and what waits fail, and the next request starts it again)."""
        assert self.encoder is not None
        try:
            vectors = self.encoder.encode([item.ids for item in batch])
        except EngineCoreDied as exc:
            logger.error("The embedding model stopped: %s", exc)
            self.crashed(str(exc))
            for item in batch:
                _settle(item, exception=EngineDeadError(self.unavailable_reason()))
            return False
        except Exception as exc:  # this batch fails; the next one is tried afresh
            logger.exception("Encoding a batch of %d inputs failed", len(batch))
            for item in batch:
                _settle(item, exception=RuntimeError(f"Encoding failed: {exc}"))
            return True
        with self._stats_lock:
            self._stats.inputs += len(batch)
            self._stats.tokens += sum(len(item.ids) for item in batch)
            self._stats.batches += 1
        for item, vector in zip(batch, vectors, strict=True):
            _settle(item, result=vector)
        return True

    def _fail_waiting(self) -> None:
        while True:
            try:
                item = self._inputs.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Input):
                _settle(item, exception=EngineDeadError(self.unavailable_reason()))


def _settle(item: _Input, result: torch.Tensor | None = None,
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
