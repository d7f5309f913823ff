"""One sequence as the engine core sees it: token ids, progress, KV blocks."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"

    @property
    def finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        """OpenAI's finish_reason for a finished status, else None."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass(frozen=True)
class EngineCoreRequest:
    """What the front end hands the core: one sequence to generate.

    A request with n > 1 reaches the core as n of these (engine/input_processor.py), each
    with its own `seed` (the request's seed plus the sequence's index), so that every
    sequence draws its own reproducible noise.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int | None = None
    cache_salt: str | None = None


@dataclass(eq=False)
class Request:
    """Prompt and output token ids, progress and KV blocks of one sequence.

    `num_computed_tokens` counts tokens whose KV is in the cache. Everything in
    `all_token_ids` past it still has to run through the model; after preemption by
    recompute that includes the output generated so far.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    seed: int | None = None
    cache_salt: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    stop_reason: int | None = None  # the stop token that ended it
    scheduled: bool = False  # admitted at least once

    def __post_init__(self) -> None:
        self.all_token_ids: list[int] = list(self.prompt_token_ids)

    @classmethod
    def from_core_request(cls, req: EngineCoreRequest, eos_token_ids: frozenset[int]) -> Request:
        return cls(req.request_id, req.prompt_token_ids, req.params, eos_token_ids, req.seed,
                   req.cache_salt)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
