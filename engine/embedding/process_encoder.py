"""ProcessEncoder: an embedding model in a process of its own (encoder_process.py), behind
the Encoder interface AsyncEmbedder runs, so a load or a crash there stalls nothing in the
server. Created and closed on the AsyncEmbedder's thread, which outlives the process (its
death signal is tied to that thread: core_client/child_process.py)."""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from officellm.engine.core_client.child_process import ChildProcess
from officellm.engine.core_client.core_client import EngineCoreDied, EngineLoadError
from officellm.engine.embedding import encoder_wire as wire

ENCODER_PROCESS = "officellm.engine.embedding.encoder_process"


class ProcessEncoder:
    """Loads `model_dir` in an embedding process (blocking until it is ready), behind the
    models serving beside it if `behind_others`."""

    def __init__(self, model_dir: str | Path, label: str, behind_others: bool = False) -> None:
        self.label = label
        self._child = ChildProcess(ENCODER_PROCESS, "embedding process")
        self._channel = self._child.start(wire.FromEncoder, behind_others)
        self._channel.send(wire.LoadEncoder(str(model_dir), label,
                                            logging.getLogger().getEffectiveLevel()))
        message = self._channel.receive()
        if not isinstance(message, wire.EncoderReady):
            cause = (None if isinstance(message, wire.EncoderLoadFailed)
                     else self._child.cause(label))
            self.close()
            if isinstance(message, wire.EncoderLoadFailed):
                raise EngineLoadError(message.reason)
            raise EngineCoreDied(cause)
        self.model_dir, self.info = Path(message.model_dir), message.info
        self.died: str | None = None  # the cause, once the process has gone
        self._watchers: list[Callable[[str], None]] = []
        self._calls = itertools.count()
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._lock = threading.Lock()
        self._closing = False
        self._reader = threading.Thread(target=self._read, name=f"encoder-{self._child.pid}",
                                        daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int | None:
        return self._child.pid

    def tokenize(self, text: str, max_length: int | None = None) -> list[int]:
        """The model's ids for `text`, from its own tokenizer (blocking: call it off the
        event loop)."""
        return self._ask(lambda call: wire.Tokenize(call, text, max_length))

    def encode(self, batch: list[list[int]]) -> torch.Tensor:
        """One float32 vector per input. Raises EngineCoreDied if the process has gone."""
        data = self._ask(lambda call: wire.Encode(call, batch))
        return torch.frombuffer(bytearray(data), dtype=torch.float32).view(len(batch), -1)

    def watch(self, died: Callable[[str], None]) -> None:
        """Call `died(cause)` when the process goes without being closed."""
        self._watchers.append(died)

    def close(self) -> None:
        """Stop the process and wait for it (idempotent)."""
        self._closing = True
        self._channel.send(wire.StopEncoder())
        self._child.wait()
        self._channel.close()

    def _ask(self, message) -> object:
        call, done = next(self._calls), concurrent.futures.Future()
        with self._lock:
            if self.died is not None:
                raise EngineCoreDied(self.died)
            self._pending[call] = done
        if not self._channel.send(message(call)):
            with self._lock:
                self._pending.pop(call, None)
            raise EngineCoreDied(self.died or f"the embedding process of `{self.label}` has "
                                 "gone")
        return done.result()

    def _read(self) -> None:
        while True:
            message = self._channel.receive()
            if message is None:
                break
            with self._lock:
                done = self._pending.pop(message.call, None)
            if done is None:
                continue
            if isinstance(message, wire.Encoded) and message.error is not None:
                done.set_exception(RuntimeError(message.error))
            else:
                done.set_result(message.ids if isinstance(message, wire.Tokenized)
                                else message.vectors)
        cause = self._child.cause(self.label)
        with self._lock:
            self.died, pending, self._pending = cause, self._pending, {}
        for done in pending.values():
            done.set_exception(EngineCoreDied(cause))
        if not self._closing:
            for died in self._watchers:
                died(cause)
