"""What the sampler reads of one step's sampling requests: plain data, built by the model
runner from the scheduled requests, so the sampler never holds the core's Request objects."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from officellm.engine.core.request import Request, RequestParams


@dataclass(frozen=True)
class SamplingRow:
    """One sampled row of the logits: its request's settings and the token ids its penalties
    and min_tokens read (the request's own lists, as they stand when the step runs)."""

    request_id: str
    seed: int | None
    params: RequestParams
    all_token_ids: list[int]  # prompt and output (the repetition penalty's)
    output_token_ids: list[int]  # output only (presence and frequency penalties', min_tokens')
    eos_token_ids: frozenset[int]
    # Speculation: the draft this row's token is verified against (rejection sampling keeps
    # the row's distribution exactly: engine/worker/sampler.py); None for an ordinary row.
    draft_token: int | None = None

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @classmethod
    def of(cls, r: Request) -> SamplingRow:
        """The row of a request that samples its next token."""
        return cls(r.request_id, r.seed, r.params, r.all_token_ids, r.output_token_ids,
                   r.eos_token_ids)

    @classmethod
    def with_drafts(cls, r: Request, draft: tuple[int, ...]) -> list[SamplingRow]:
        """The rows of a decode verifying `draft`: the row after the i-th draft sees the
        drafts before it as output, as a step after accepting them would (penalties and
        min_tokens read them), and is verified against the next draft (the last row, after
        every draft, against none)."""
        rows = [cls(r.request_id, r.seed, r.params, r.all_token_ids, r.output_token_ids,
                    r.eos_token_ids, draft[0])]
        for i in range(1, len(draft) + 1):
            ahead = list(draft[:i])
            rows.append(cls(r.request_id, r.seed, r.params, r.all_token_ids + ahead,
                            r.output_token_ids + ahead, r.eos_token_ids,
                            draft[i] if i < len(draft) else None))
        return rows


@dataclass(frozen=True)
class PromptLogprobRows:
    """One chunk's rows of prompt logprobs: a logits row per position of its
    prompt_logprob_positions, each scored at the prompt token that follows it."""

    request_id: str
    next_token_ids: list[int]  # per row, the prompt token its entry is for
    num_top: int  # SamplingParams.prompt_logprobs: the top alternatives each entry holds


@dataclass(frozen=True)
class SamplingMetadata:
    """A row per request that samples this step, in logits-row order; then the rows of
    prompt logprobs, which follow the sampled rows in the logits."""

    rows: list[SamplingRow] = field(default_factory=list)
    prompt_rows: list[PromptLogprobRows] = field(default_factory=list)

    @property
    def num_prompt_rows(self) -> int:
        return sum(len(p.next_token_ids) for p in self.prompt_rows)

    @classmethod
    def from_requests(cls, requests: Iterable[Request]) -> SamplingMetadata:
        return cls([SamplingRow.of(r) for r in requests])

    def __len__(self) -> int:
        return len(self.rows)
