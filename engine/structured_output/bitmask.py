"""One step's grammar masks: which tokens each constrained row of the logits may sample."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from officellm.engine.core.request import Request


@dataclass(frozen=True)
class GrammarBitmask:
    """xgrammar's packed bitmask ([rows, ceil(vocab / 32)] int32, one bit per token) for the
    step's sampled rows, and the rows that have a grammar (the others are untouched)."""

    bitmask: torch.Tensor  # on the host: the sampler takes it to the logits' device
    rows: list[int]


def grammar_bitmask(sampling_requests: Sequence[Request], vocab_size: int) -> GrammarBitmask | None:
    """The masks of the requests that sample this step, in logits-row order; None when none
    of them has a grammar (the common case costs one pass over the list)."""
    # A request that ended after this step was scheduled (async scheduling) has a wasted
    # row: its matcher may be terminated, and nothing it samples is kept.
    rows = [i for i, r in enumerate(sampling_requests)
            if r.grammar is not None and not r.is_finished]
    if not rows:
        return None
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(len(sampling_requests), vocab_size)
    for i in rows:
        sampling_requests[i].grammar.fill_bitmask(bitmask, i)  # type: ignore[union-attr]
    return GrammarBitmask(bitmask, rows)
