"""One sequence as the engine core sees it: token ids, progress, KV blocks, and the opaque
tags the scheduling policy reads (engine/core/scheduling_policy.py).

The core is a leaf (no torch, nothing of the engine outside engine/core), so a request's
sampling parameters and grammar matcher are typed here by what the engine reads of them:
engine/frontend/sampling_params.py's SamplingParams and engine/structured_output/request_grammar.py's
RequestGrammar are the implementations.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import xgrammar as xgr

    from officellm.engine.core.logprob import Logprob


class RequestParams(Protocol):
    """A sequence's sampling parameters as the engine behind the front end reads them: the
    core's stop rules, the sampler's settings, the output processor's text options."""

    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool
    stop_token_ids: list[int]
    stop: list[str]
    skip_special_tokens: bool
    include_stop_str_in_output: bool
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    logprobs: int | None
    prompt_logprobs: int | None

    @property
    def greedy(self) -> bool: ...

    @property
    def uses_penalties(self) -> bool: ...


class SequenceGrammar(Protocol):
    """One sequence's structured-output matcher, advanced by every token it accepts."""

    @property
    def is_terminated(self) -> bool: ...

    def accept(self, token_id: int) -> bool: ...

    def sync(self, output_token_ids: list[int]) -> None: ...

    def fill_bitmask(self, bitmask: Any, row: int) -> None: ...


class PromptImage(Protocol):
    """An image of a prompt as the core reads it (engine/multimodal/inputs.py's ImageFeature
    is the implementation; the model runner reads its pixels): its placeholder tokens are
    prompt positions [offset, offset + length), and its content hash keys its KV blocks."""

    @property
    def offset(self) -> int: ...

    @property
    def length(self) -> int: ...

    @property
    def content_hash(self) -> str: ...

    @property
    def end(self) -> int: ...


class ImagePrompt(Protocol):
    """A prompt with images (engine/multimodal/inputs.py's MultiModalPrompt)."""

    @property
    def token_ids(self) -> list[int]: ...

    @property
    def images(self) -> tuple[PromptImage, ...]: ...


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

    A request with n > 1 reaches the core as n of these (engine/frontend/input_processor.py), each
    with its own `seed` (the request's seed plus the sequence's index), so that every
    sequence draws its own reproducible noise.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: RequestParams
    seed: int | None = None
    cache_salt: str | None = None
    # Opaque scheduling tags (docs/design.md §2, "Scheduling"): the engine never learns who a
    # key is. Requests without a key share one (DEFAULT_FAIRNESS_KEY).
    fairness_key: str | None = None
    priority: float = 1.0  # a weight: a key of weight 2 is owed twice the service of weight 1
    # The share of the KV pool above which the key gets no new prefill chunks while others
    # have work (None: no cap). Per key: the key's latest request sets it.
    max_kv_share: float | None = None
    # Work nobody is waiting to read (a front end's title or tags for a chat): its prompt
    # work and decodes yield to every other request's prompt work (engine/core/scheduler.py).
    background: bool = False
    # The compiled grammar of params.structured_outputs (the front end compiles it, off the
    # step loop); each sequence gets its own matcher from it.
    grammar: xgr.CompiledGrammar | None = None
    # A prompt with images: its token_ids are prompt_token_ids, its images' placeholder
    # ranges and pixels go with the request to the model runner (engine/multimodal/).
    multimodal: ImagePrompt | None = None

    def __post_init__(self) -> None:
        if self.multimodal is not None and self.multimodal.token_ids != self.prompt_token_ids:
            raise ValueError("A multimodal request's prompt_token_ids are its "
                             "MultiModalPrompt's token_ids.")
        if not self.priority > 0:
            raise ValueError(f"priority must be a positive weight, not {self.priority!r}.")
        if self.max_kv_share is not None and not 0 < self.max_kv_share <= 1:
            raise ValueError(f"max_kv_share must be in (0, 1], not {self.max_kv_share!r}.")


# The key of requests that came without one (the offline LLM, a server without users).
DEFAULT_FAIRNESS_KEY = ""


@dataclass(eq=False)
class Request:
    """Prompt and output token ids, progress and KV blocks of one sequence.

    `num_computed_tokens` counts tokens whose KV is in the cache, or is written by a step
    already scheduled (the scheduler advances it when it schedules). Everything in
    `all_token_ids` past it, and a token in flight, still has to run through the model;
    after preemption by recompute that includes the output generated so far.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: RequestParams
    eos_token_ids: frozenset[int] = frozenset()
    seed: int | None = None
    cache_salt: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    # Tokens sampled by a launched step that the host has not read yet (async scheduling:
    # 0 or 1). The next step may already run on the one in flight, read on the device.
    num_in_flight: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    # Per KV cache group (engine/core/kv_cache_groups.py), its block table: entry i holds
    # tokens [i * block_size, (i + 1) * block_size); a sliding group's entries behind its
    # window are the null block.
    block_ids: list[list[int]] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    stop_reason: int | None = None  # the stop token that ended it
    scheduled: bool = False  # admitted at least once
    fairness_key: str = DEFAULT_FAIRNESS_KEY
    priority: float = 1.0
    max_kv_share: float | None = None
    background: bool = False  # EngineCoreRequest.background
    # time.monotonic() when the core received it, and when it was first admitted: the queue
    # time (vllm:request_queue_time_seconds) is their difference.
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    num_preemptions: int = 0  # times this request gave its blocks back (by recompute)
    grammar: SequenceGrammar | None = None  # the structured-output matcher, if constrained
    # Past the model's original window (Scheduler.long_context_after): its KV is computed in
    # the model's long-context form (LongRoPE's long factors), all of it, and its blocks are
    # cached apart from the short form's.
    long_context: bool = False
    # Speculation: the drafts to verify in the next step (engine/core/ngram_proposer.py),
    # the share of drafts accepted lately, and steps left without drafting after a run of
    # rejections (engine/core/speculation.py).
    draft_token_ids: list[int] = field(default_factory=list)
    draft_acceptance: float = 0.5  # a prior: a sequence must earn a better one
    draft_pause: int = 0
    draft_pauses: int = 0
    # params.prompt_logprobs: the entries computed so far, entry j for prompt token j + 1
    # (what position j's logits say of it), until they go out with the first sampled token.
    prompt_logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    prompt_logprobs_sent: bool = False
    # The prompt's images in prompt order (placeholder ranges, content hashes, pixels): the
    # scheduler keeps each image's range in one chunk, the prefix cache keys blocks by their
    # hashes, the model runner encodes them (engine/worker/encoder_cache.py).
    images: tuple[PromptImage, ...] = ()

    def __post_init__(self) -> None:
        self.all_token_ids: list[int] = list(self.prompt_token_ids)

    @classmethod
    def from_core_request(cls, req: EngineCoreRequest, eos_token_ids: frozenset[int],
                          grammar: SequenceGrammar | None = None) -> Request:
        """The core's request for `req`; `grammar` is the matcher the caller made from
        req.grammar (the engine core: it knows xgrammar, the core does not)."""
        key = DEFAULT_FAIRNESS_KEY if req.fairness_key is None else req.fairness_key
        return cls(req.request_id, req.prompt_token_ids, req.params, eos_token_ids, req.seed,
                   req.cache_salt, fairness_key=key, priority=req.priority,
                   max_kv_share=req.max_kv_share, background=req.background,
                   grammar=grammar,
                   images=() if req.multimodal is None else req.multimodal.images)

    @property
    def queue_time(self) -> float | None:
        """Seconds from arrival to first admission (None until admitted)."""
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

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
    def num_tokens_to_compute(self) -> int:
        """Tokens not yet scheduled through the model: known ones and one in flight."""
        return len(self.all_token_ids) + self.num_in_flight - self.num_computed_tokens

    @property
    def owes_prompt_logprobs(self) -> bool:
        """Asked for prompt logprobs that have not gone out yet: its prompt's logits must be
        computed, not taken from the prefix cache."""
        return self.params.prompt_logprobs is not None and not self.prompt_logprobs_sent

    def prompt_logprob_positions(self, start: int, num_new: int) -> range:
        """The positions of a chunk of `num_new` tokens from `start` whose logits give prompt
        logprobs still missing (the last prompt position's give the first sampled token)."""
        if not self.owes_prompt_logprobs:
            return range(0)
        first = max(start, len(self.prompt_logprobs))
        return range(first, max(first, min(start + num_new, self.num_prompt_tokens - 1)))

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
