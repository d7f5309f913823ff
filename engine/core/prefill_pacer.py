"""Prefill pacing: how many prompt tokens a step may carry while others are decoding.

A fixed token budget is the wrong unit on the CPU: 1024 prompt tokens take a GPU ~10 ms but
a laptop CPU a second or more, and every user typing along waits that second for their next
word (docs/design.md §9, "everyone's answer freezes at once"). The pacer measures instead: it fits
step time = a + b * decodes + c * prefill tokens + e * prefill tokens x their context over
the recent steps, and sizes a step's prefill so the whole step costs about `max_slowdown`
times what its decodes alone would. The context term is attention: the last chunks of a
6,000-token paste cost about three times its first ones per token, and a fit without it lags
behind and lets the stall grow just when the paste is longest.
Alone (no decodes running) a prompt still gets the full token budget: nobody is waiting.

Why a fit and not one average of decode-only steps: under steady load nearly every step
carries some prompt, so decode-only steps are rare and come from whatever batch size was
running then; a stale small-batch figure starved prompts at 32 users (6 s to first token).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass
class PrefillPacer:
    """Learns step costs from `observe` and answers `prefill_cap`."""

    max_slowdown: float  # a step with decodes costs at most this many decode-only steps
    min_chunk: int = 16  # always make some progress on the prompt
    first_chunk: int = 64  # before anything is measured
    window: int = 64  # recent steps the fit uses
    # (decodes, prefill tokens, sum of each prefill token's context, seconds)
    steps: deque = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.max_slowdown <= 1:
            raise ValueError("max_slowdown must be above 1 (a decode-only step is 1).")
        self.steps = deque(self.steps, maxlen=self.window)

    def prefill_cap(self, num_decodes: int, context: int = 0,
                    slowdown: float | None = None, spent: float = 0.0) -> int:
        """The most prefill tokens for a step that also carries `num_decodes` decodes, for a
        prompt whose chunk starts `context` tokens in; `slowdown` overrides max_slowdown
        (the scheduling policy's, for one key's prompt); `spent` is what the step's earlier
        chunks cost already (their `chunk_cost`s): the room is time, and a token deep in a
        long paste takes more of it than one of a short prompt."""
        costs = self.costs()
        slowdown = self.max_slowdown if slowdown is None else slowdown
        if costs is None:  # until measured, the room is first_chunk tokens of any context
            room, token_cost = self.first_chunk * (slowdown - 1) / (self.max_slowdown - 1), 1.0
        else:
            fixed, per_decode, per_token, per_token_context = costs
            room = (slowdown - 1.0) * (fixed + per_decode * num_decodes)
            token_cost = per_token + per_token_context * context
        if not spent:
            return max(self.min_chunk, round(room / token_cost))
        return max(0, math.floor((room - spent) / token_cost))

    def chunk_cost(self, tokens: int, context: int = 0) -> float:
        """What a chunk of `tokens` starting `context` tokens in adds to a step, in the units
        prefill_cap's `spent` takes (seconds once measured, tokens before)."""
        costs = self.costs()
        if costs is None:
            return float(tokens)
        _, _, per_token, per_token_context = costs
        return tokens * (per_token + per_token_context * context)

    def observe(self, num_decodes: int, num_prefill_tokens: int, seconds: float,
                prefill_context: int = 0) -> None:
        """Record one step: its decodes, its prefill tokens and the sum of their contexts
        (tokens each attends to), and how long it took."""
        self.steps.append((num_decodes, num_prefill_tokens, prefill_context, seconds))

    def costs(self) -> tuple[float, float, float, float] | None:
        """(seconds per step, per decode, per prefill token, per prefill token and context
        token) from the recent steps, or None while they cannot tell (no prompt measured
        yet, or no decode)."""
        if not self.steps:
            return None
        data = np.asarray(self.steps, dtype=np.float64)
        decodes, tokens, context, seconds = data[:, 0], data[:, 1], data[:, 2], data[:, 3]
        if not tokens.any() or not decodes.any():
            return None
        rows = np.column_stack([np.ones_like(decodes), decodes, tokens, context])
        # lstsq returns the least-norm fit when the steps vary too little to separate the
        # terms (e.g. always 8 decodes): still a usable split of the time.
        (fixed, per_decode, per_token, per_ctx), *_ = np.linalg.lstsq(rows, seconds, rcond=None)
        per_ctx = max(per_ctx, 0.0)
        mean_ctx = float(context[tokens > 0].sum() / tokens[tokens > 0].sum())
        if per_token + per_ctx * mean_ctx <= 0 or fixed + per_decode * max(decodes.max(), 1.0) <= 0:
            return self._averages(decodes, tokens, seconds)
        per_token = max(per_token, 0.1 * (per_token + per_ctx * mean_ctx))
        return float(fixed), float(per_decode), float(per_token), float(per_ctx)

    @staticmethod
    def _averages(decodes: np.ndarray, tokens: np.ndarray,
                  seconds: np.ndarray) -> tuple[float, float, float, float] | None:
        """The plain estimate when the fit is not physical: mean decode-only step time, and
        the mean extra time per prompt token of the steps that carried one."""
        pure = seconds[tokens == 0]
        if pure.size == 0:
            return None
        step = float(pure.mean())
        mixed = tokens > 0
        extra = np.clip(seconds[mixed] - step, 0.0, None) / tokens[mixed]
        per_token = float(extra.mean())
        return (step, 0.0, per_token, 0.0) if per_token > 0 else None
