"""What an engine process and the server say to each other, and how it travels: msgpack
frames (msgspec), each a length and one message, over a Unix socket pair. Only these types
are decoded, so a frame can never make an object the schema does not name (no pickle)."""

from __future__ import annotations

import socket
import struct
import threading
from dataclasses import dataclass

import msgspec

from officellm.engine.config import EngineConfig
from officellm.engine.core.request import EngineCoreRequest
from officellm.engine.core.scheduler_output import EngineCoreOutput
from officellm.engine.front_end import EngineInfo
from officellm.engine.sampling_params import SamplingParams
from officellm.engine.stats import EngineStats
from officellm.engine.structured_output import StructuredOutputsParams

_LENGTH = struct.Struct("!I")


@dataclass(frozen=True)
class WireRequest:
    """An EngineCoreRequest as it travels: its grammar is compiled again on arrival."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int | None
    cache_salt: str | None
    fairness_key: str | None
    priority: float
    max_kv_share: float | None

    @classmethod
    def of(cls, r: EngineCoreRequest) -> WireRequest:
        assert isinstance(r.params, SamplingParams)
        return cls(r.request_id, r.prompt_token_ids, r.params, r.seed, r.cache_salt,
                   r.fairness_key, r.priority, r.max_kv_share)

    def core_request(self, grammar: object | None) -> EngineCoreRequest:
        return EngineCoreRequest(self.request_id, self.prompt_token_ids, self.params, self.seed,
                                 self.cache_salt, self.fairness_key, self.priority,
                                 self.max_kv_share, grammar)  # type: ignore[arg-type]


# -- the server to the engine process ---------------------------------------------------------
class Start(msgspec.Struct, tag=True):
    config: EngineConfig
    label: str  # the model's name, for the process's log lines
    log_level: int


class Add(msgspec.Struct, tag=True):
    requests: list[WireRequest]


class Abort(msgspec.Struct, tag=True):
    core_ids: list[str]


class Purge(msgspec.Struct, tag=True):
    call: int
    cache_salt: str | None


class Compile(msgspec.Struct, tag=True):
    call: int
    params: StructuredOutputsParams


class Stop(msgspec.Struct, tag=True):
    pass


# -- the engine process to the server ---------------------------------------------------------
class Ready(msgspec.Struct, tag=True):
    info: EngineInfo
    stats: EngineStats


class LoadFailed(msgspec.Struct, tag=True):
    reason: str  # LoadFailure.reason: one line


class Step(msgspec.Struct, tag=True):
    outputs: list[EngineCoreOutput]
    stats: EngineStats | None  # None: unchanged (outputs sent from outside the loop)


class Purged(msgspec.Struct, tag=True):
    call: int
    dropped: int
    error: str | None = None


class Compiled(msgspec.Struct, tag=True):
    call: int
    error: str | None = None  # StructuredOutputError's sentence


class Stopped(msgspec.Struct, tag=True):
    pass


ToEngine = Start | Add | Abort | Purge | Compile | Stop
FromEngine = Ready | LoadFailed | Step | Purged | Compiled | Stopped


class Channel:
    """One end of the socket pair: whole messages out (from any thread) and in (from one)."""

    def __init__(self, sock: socket.socket, receives: type) -> None:
        self.sock = sock
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(receives)
        self._send_lock = threading.Lock()

    def send(self, message: msgspec.Struct) -> bool:
        """Send one message; False if the other end has gone."""
        payload = self._encoder.encode(message)
        try:
            with self._send_lock:
                self.sock.sendall(_LENGTH.pack(len(payload)) + payload)
        except OSError:
            return False
        return True

    def receive(self) -> object | None:
        """The next message; None once the other end has gone (or closed its end)."""
        header = self._read(_LENGTH.size)
        if header is None:
            return None
        body = self._read(_LENGTH.unpack(header)[0])
        return None if body is None else self._decoder.decode(body)

    def _read(self, n: int) -> bytes | None:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            try:
                k = self.sock.recv_into(view[got:])
            except OSError:
                return None
            if k == 0:
                return None
            got += k
        return bytes(buf)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
