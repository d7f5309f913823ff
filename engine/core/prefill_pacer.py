"""Prefill pacing: how many prompt tokens a step may carry while others are decoding.

A fixed token budget is the wrong unit on the CPU: 1024 prompt tokens take a GPU ~10 ms but
a laptop CPU a second or more, and every user typing along waits that second for their next
word (docs/design.md §9, "everyone's answer freezes at once"). The pacer measures instead: it fits
step time = a + b * rows (decodes and prompt tokens) + e * attention pairs (each prompt
token times its context, plus each decode's context), every coefficient at least 0, over the
recent steps, and sizes a step's prefill so the whole step costs about `max_slowdown` times
what its decodes alone would. The pairs term is attention: a token deep in a 6,000-token
paste costs about three times one of its first, and 19 such tokens cost a CPU five times a
3-decode step; a fit without it lags behind and lets the stall grow just when the paste is
longest. Alone (nobody waits on the step for a token) a prompt gets the full token budget.

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
    min_chunk: int = 4  # always make some progress on the prompt
    first_chunk: int = 64  # before anything is measured
    window: int = 64  # recent steps the fit uses
    # (decodes, prefill tokens, attention pairs of decodes and prompt tokens, prompt chunks'
    # cached context, seconds)
    steps: deque = field(default_factory=deque)
    _fit: tuple[float, float, float, float] | None = field(default=None, init=False, repr=False)
    _fitted: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_slowdown <= 1:
            raise ValueError("max_slowdown must be above 1 (a decode-only step is 1).")
        self.steps = deque(self.steps, maxlen=self.window)

    def prefill_cap(self, num_decodes: int, context: int = 0,
                    slowdown: float | None = None, spent: float = 0.0,
                    decode_context: float = 0.0) -> int:
        """The most prefill tokens for a step that also carries `num_decodes` decodes (of
        `decode_context` tokens each, on average), for a prompt whose chunk starts `context`
        tokens in; `slowdown` overrides max_slowdown (the scheduling policy's, for one key's
        prompt); `spent` is what the step's earlier chunks cost already (their
        `chunk_cost`s): the room is time, and a token deep in a long paste takes more of it
        than one of a short prompt."""
        costs = self.costs()
        slowdown = self.max_slowdown if slowdown is None else slowdown
        if costs is None:  # until measured, the room is first_chunk tokens of any context
            room, token_cost = self.first_chunk * (slowdown - 1) / (self.max_slowdown - 1), 1.0
            history = 0.0
        else:
            fixed, per_row, per_pair, per_chunk_context = costs
            room = (slowdown - 1.0) * (fixed + num_decodes * (per_row + per_pair * decode_context))
            token_cost = per_row + per_pair * context
            history = per_chunk_context * context  # reading the chunk's cached history
        if not spent:  # the step's first chunk: at least min_chunk
            return max(self.min_chunk, round((room - history) / token_cost))
        return max(0, math.floor((room - spent - history) / token_cost))

    def chunk_cost(self, tokens: int, context: int = 0) -> float:
        """What a chunk of `tokens` starting `context` tokens in adds to a step, in the units
        prefill_cap's `spent` takes (seconds once measured, tokens before)."""
        costs = self.costs()
        if costs is None:
            return float(tokens)
        _, per_row, per_pair, per_chunk_context = costs
        return per_chunk_context * context + tokens * (per_row + per_pair * context)

    def observe(self, num_decodes: int, num_prefill_tokens: int, seconds: float,
                prefill_context: int = 0, decode_context: int = 0,
                chunk_context: int = 0) -> None:
        """Record one step: its decodes, its prefill tokens, the sum of the prefill tokens'
        contexts and of the decodes' contexts (tokens each attends to), the sum of its
        prompt chunks' cached contexts, and how long it took."""
        self.steps.append((num_decodes, num_prefill_tokens, prefill_context + decode_context,
                           chunk_context, seconds))
        self._fitted = False

    def costs(self) -> tuple[float, float, float, float] | None:
        """(seconds per step, per row: a decode or a prompt token, per attention pair: a
        token and one token of context it attends to, per cached token a prompt chunk
        reads) from the recent steps, or None while they cannot tell (no prompt or no decode
        measured yet, or no cost that grows with the work). Fitted once per observed step."""
        if not self._fitted:
            self._fit, self._fitted = self._costs(), True
        return self._fit

    def _costs(self) -> tuple[float, float, float, float] | None:
        if not self.steps:
            return None
        data = np.asarray(self.steps, dtype=np.float64)
        decodes, tokens, pairs, chunk_ctx, seconds = data.T
        if not tokens.any() or not decodes.any():
            return None
        # One cost per row for decodes and prompt tokens alike (the same matmuls): a separate
        # decode term could not be told from the fixed cost when the batch hardly changes.
        # The chunk's cached context is read (gathered, converted) once per chunk, whatever
        # its length: 19 tokens 5,000 deep cost a CPU 2.5 times their share of 64 such.
        columns = np.column_stack([np.ones_like(decodes), decodes + tokens, pairs, chunk_ctx])
        fixed, per_row, per_pair, per_chunk_context = (
            float(c) for c in _nonnegative_fit(columns, seconds))
        mean_ctx = float(pairs[tokens > 0].sum() / tokens[tokens > 0].sum())
        if per_row + per_pair * mean_ctx <= 0:
            return None
        # A short prompt's token is never free: its matmul rows cost it something.
        per_row = max(per_row, 0.1 * (per_row + per_pair * mean_ctx))
        return fixed, per_row, per_pair, per_chunk_context


def _nonnegative_fit(rows: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient at least 0: the best plain fit over each subset
    of the columns whose solution is non-negative. A free fit extrapolates wildly when the
    steps vary too little to separate the terms (always 3 decodes and ~20 paste tokens: a
    fixed cost of 0.8 s and -0.26 s a decode, so the predicted decode-only step was twice the
    real one and the paste's chunks three times too big). Four columns: 15 small fits."""
    n = rows.shape[1]
    best, best_err = np.zeros(n), float(np.sum(seconds ** 2))
    for mask in range(1, 1 << n):
        cols = [i for i in range(n) if mask >> i & 1]
        coef, *_ = np.linalg.lstsq(rows[:, cols], seconds, rcond=None)
        if (coef < 0).any():
            continue
        err = float(np.sum((rows[:, cols] @ coef - seconds) ** 2))
        if err < best_err - 1e-15:
            best, best_err = np.zeros(n), err
            best[cols] = coef
    return best
