"""What an engine process and the server say to each other (over channel.py's frames). Only
these types are decoded, so a frame can never make an object the schema does not name."""

from __future__ import annotations

from dataclasses import dataclass, replace

import msgspec

from officellm.engine.config import EngineConfig
from officellm.engine.core.request import EngineCoreRequest
from officellm.engine.core.scheduler_output import EngineCoreOutput
from officellm.engine.frontend.front_end import EngineInfo
from officellm.engine.frontend.sampling_params import SamplingParams
from officellm.engine.stats import EngineStats
from officellm.engine.structured_output import StructuredOutputsParams

MAX_TOKENS_ON_THE_WIRE = 2**62


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
    background: bool = False

    @classmethod
    def of(cls, r: EngineCoreRequest) -> WireRequest:
        params = r.params
        assert isinstance(params, SamplingParams)
        if params.max_tokens is not None and params.max_tokens > MAX_TOKENS_ON_THE_WIRE:
            # A max_tokens past any window means "to the window" (the core stops there), and
            # msgpack carries integers of 64 bits: 10**30 from a client is the same request.
            params = replace(params, max_tokens=MAX_TOKENS_ON_THE_WIRE)
        return cls(r.request_id, r.prompt_token_ids, params, r.seed, r.cache_salt,
                   r.fairness_key, r.priority, r.max_kv_share, r.background)

    def core_request(self, grammar: object | None) -> EngineCoreRequest:
        return EngineCoreRequest(self.request_id, self.prompt_token_ids, self.params, self.seed,
                                 self.cache_salt, self.fairness_key, self.priority,
                                 self.max_kv_share, background=self.background,
                                 grammar=grammar)  # type: ignore[arg-type]


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
