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

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)


@dataclass(frozen=True)
class SamplingMetadata:
    """A row per request that samples this step, in logits-row order."""

    rows: list[SamplingRow] = field(default_factory=list)

    @classmethod
    def from_requests(cls, requests: Iterable[Request]) -> SamplingMetadata:
        return cls([SamplingRow(r.request_id, r.seed, r.params, r.all_token_ids,
                                r.output_token_ids, r.eos_token_ids) for r in requests])

    def __len__(self) -> int:
        return len(self.rows)
