"""AsyncEmbedder: an embedding model on its own thread, fed from asyncio.

Inputs from concurrent requests are encoded together: the thread takes what is waiting (up
to MAX_BATCH_INPUTS inputs and MAX_BATCH_TOKENS padded tokens) into one forward pass, so ten
people's document chunks cost about one pass, not ten. Like AsyncLLM, it loads the model on
that thread, blocks when idle (no CPU), and a failure is one sentence for the operator
(engine/batching_thread.py has what it shares with the reranker and the transcriber).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from officellm.engine.batching_thread import BatchingThread, Joining
from officellm.engine.core_client.core_client import EngineCoreDied
from officellm.engine.embedding.encoders import Encoder
from officellm.engine.embedding.sentence_encoder import EncoderInfo
from officellm.engine.model_lifecycle import EngineDeadError, LoadFailure

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


class AsyncEmbedder(BatchingThread[_Input, EmbedderStats]):
    """Runs the encoder `factory` builds on a dedicated thread."""

    noun = "embedding model"
    load_noun = "embedding model"
    thread_name = "embedder"
    max_batch = MAX_BATCH_INPUTS
    item_noun = "inputs"

    def __init__(self, factory: Callable[[], Encoder],
                 on_load_failure: Callable[[LoadFailure], None] | None = None) -> None:
        # on_load_failure: `officellm serve` stops, as for the chat model: a server asked to
        # embed that cannot is not half-started.
        super().__init__(EmbedderStats(), on_load_failure)
        self._factory = factory
        self.encoder: Encoder | None = None

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
        self._check_ready()
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in inputs]
        self._submit([_Input(ids, future, loop)
                      for ids, future in zip(inputs, futures, strict=True)])
        vectors: list[torch.Tensor] = list(await asyncio.gather(*futures))
        if dimensions is not None:
            vectors = [v[:dimensions] for v in vectors]
            if self.info.normalized:
                vectors = [torch.nn.functional.normalize(v, dim=0) for v in vectors]
        return [v.tolist() for v in vectors]

    # -- the thread (BatchingThread's) ---------------------------------------------------
    def _load(self) -> None:
        self.encoder = self._factory()
        self.encoder.watch(self._model_died)

    def _free(self) -> None:
        if self.encoder is not None:
            self.encoder.close()
        self.encoder = None

    def _joins(self, batch: list[_Input], item: _Input) -> Joining:
        """An input joins while the padded batch stays within MAX_BATCH_TOKENS; the first
        that would not ends the batch and waits for the next (order among inputs is not
        promised)."""
        longest = max(len(i.ids) for i in batch)
        if max(longest, len(item.ids)) * (len(batch) + 1) > MAX_BATCH_TOKENS:
            return Joining.FULL
        return Joining.TAKEN

    def _run_batch(self, batch: list[_Input]) -> bool:
        """Encode a batch and answer its inputs; False if the encoder's process died (the
        batch and what waits fail, and the next request starts it again)."""
        assert self.encoder is not None
        try:
            vectors = self.encoder.encode([item.ids for item in batch])
        except EngineCoreDied as exc:
            logger.error("The embedding model stopped: %s", exc)
            self.crashed(str(exc))
            self._fail_with(batch, EngineDeadError(self.unavailable_reason()))
            return False
        except Exception as exc:
            self._fail_batch(batch, "Encoding", exc)
            return True
        with self._stats_lock:
            self._stats.inputs += len(batch)
            self._stats.tokens += sum(len(item.ids) for item in batch)
            self._stats.batches += 1
        self._answer(batch, vectors)
        return True
