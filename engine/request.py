"""One generation as the scheduler sees it."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from engine.outputs import RequestMetrics, SampleLogprobs
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
        return self.value.startswith("finished")

    @property
    def finish_reason(self) -> str | None:
        return {
            RequestStatus.FINISHED_STOPPED: "stop",
            RequestStatus.FINISHED_LENGTH: "length",
            RequestStatus.FINISHED_ABORTED: "abort",
            RequestStatus.FINISHED_ERROR: "error",
        }.get(self)


@dataclass(eq=False)
class Request:
    """Prompt and output token ids, progress, KV blocks and timing of one sequence.

    `num_computed_tokens` counts tokens whose KV is in the cache. Everything in
    `all_token_ids` past it still has to run through the model; after preemption by
    recompute that includes the output generated so far.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    parent_id: str | None = None  # the user's request id when n > 1
    index: int = 0  # which of the parent's n sequences
    user: str | None = None
    thread: str | None = None
    cache_salt: str | None = None
    prompt: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    num_preemptions: int = 0
    stop_reason: int | str | None = None
    logprobs: SampleLogprobs | None = None
    error: str | None = None
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(time.monotonic()))

    def __post_init__(self) -> None:
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        if self.params.logprobs is not None:
            self.logprobs = []

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
    def output_id(self) -> str:
        """The id outputs are reported under (the parent's when n > 1)."""
        return self.parent_id or self.request_id

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
