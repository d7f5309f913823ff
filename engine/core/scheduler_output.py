"""What one step runs (the scheduler's decision), what the model sampled for it, and what it
produced per request: plain data, no tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from officellm.engine.core.logprob import Logprob
from officellm.engine.core.lower_tier import BlockSave
from officellm.engine.core.request import Request


class ScheduledChunk(NamedTuple):
    """`num_new_tokens` of a request's tokens, from position `start`, run in this step.
    (A named tuple: immutable, and cheap to make for each request in every step.)"""

    request: Request
    start: int  # the request's computed tokens when the step was scheduled
    num_new_tokens: int
    samples: bool  # the chunk reaches the request's last known token, so it samples the next
    # A decode's drafts (speculation): run after its last known token, each position
    # sampled; num_new_tokens counts them too.
    draft: tuple[int, ...] = ()
    # Prompt logprobs (SamplingParams.prompt_logprobs): the chunk's positions whose logits
    # are computed for them too, position j's giving prompt token j + 1's entry.
    prompt_logprob_positions: range = range(0)

    @property
    def is_decode(self) -> bool:
        return self.num_new_tokens == 1 + len(self.draft) and self.samples


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's batch, frozen when scheduled: decodes first, then prefill chunks.

    Every number is read at scheduling time, so nothing here changes when the step's
    results advance the requests.
    """

    chunks: tuple[ScheduledChunk, ...]
    # Requests that finished since the previous step: the runner drops their state.
    finished_request_ids: frozenset[str] = frozenset()
    num_preempted: int = 0
    # Blocks the step fills, copied out to the tiers below the pool after it
    # (engine/core/lower_tier.py).
    kv_saves: tuple[BlockSave, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.chunks

    @property
    def num_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)

    @property
    def num_decodes(self) -> int:
        return sum(1 for c in self.chunks if c.is_decode)

    @property
    def num_decode_rows(self) -> int:
        """Tokens the decodes run: one each, and their drafts."""
        return sum(c.num_new_tokens for c in self.chunks if c.is_decode)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks if not c.is_decode)

    @property
    def prefill_context(self) -> int:
        """Sum over this step's prompt tokens of the context each attends to: the
        attention share of the prefill's cost (engine/core/prefill_pacer.py)."""
        return sum(c.num_new_tokens * (c.start + c.num_new_tokens // 2)
                   for c in self.chunks if not c.is_decode)

    @property
    def chunk_context(self) -> int:
        """Sum over this step's prompt chunks of the cached tokens each reads first."""
        return sum(c.start for c in self.chunks if not c.is_decode)

    @property
    def decode_context(self) -> int:
        """Sum over this step's decodes of the context each attends to."""
        return sum(c.start for c in self.chunks if c.is_decode)

    @property
    def sampling_requests(self) -> list[Request]:
        """The request of each sampled row, in batch (and so logits-row) order: a decode
        with drafts has a row per position."""
        return [c.request for c in self.chunks if c.samples
                for _ in range(1 + len(c.draft))]


@dataclass(frozen=True)
class SamplerOutput:
    """One step's samples, a row per sampled position (in batch order): one per request
    that sampled, and one more per draft it verified."""

    token_ids: list[int]
    logprobs: list[dict[int, Logprob] | None]
    invalid: list[bool]  # rows whose logits held NaN: those requests fail, the rest go on
    # One list per chunk with prompt_logprob_positions, in batch order: an entry a position.
    prompt_logprobs: list[list[dict[int, Logprob]]] = field(default_factory=list)

    @classmethod
    def empty(cls) -> SamplerOutput:
        return cls([], [], [])


@dataclass(slots=True)
class EngineCoreOutput:
    """What one step did for one request: the token it sampled, or how it ended.

    `finish_reason` is set on the request's last output ("stop" for EOS or a stop token,
    "length", "error" with `error` saying why).
    """

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None
    stop_reason: int | None = None  # the stop token id that ended it
    num_cached_tokens: int = 0
    error: str | None = None
    # Seconds the request waited in the core before its first admission; on its first
    # output only (vllm:request_queue_time_seconds).
    queue_time: float | None = None
    # SamplingParams.prompt_logprobs' entries, None for the first prompt token; on the
    # output of the first sampled token only.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
