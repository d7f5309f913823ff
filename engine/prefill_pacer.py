"""Prefill pacing: how many prompt tokens a step may carry while others are decoding.

A fixed token budget is the wrong unit on the CPU: 1024 prompt tokens take a GPU ~10 ms but
a laptop CPU a second or more, and every user typing along waits that second for their next
word (DESIGN §9, "everyone's answer freezes at once"). The pacer measures instead. It keeps
moving averages of a decode-only step's time and of the extra time each prefill token adds,
and sizes a step's prefill so the whole step costs about `max_slowdown` decode-only steps.
Alone (no decodes running) a prompt still gets the full token budget: nobody is waiting.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrefillPacer:
    """Learns step costs from `observe` and answers `prefill_cap`."""

    max_slowdown: float  # a step with decodes costs at most this many decode-only steps
    min_chunk: int = 16  # always make some progress on the prompt
    first_chunk: int = 64  # before anything is measured
    smoothing: float = 0.3  # weight of the newest observation in the moving averages
    decode_step_s: float | None = None
    prefill_token_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_slowdown <= 1:
            raise ValueError("max_slowdown must be above 1 (a decode-only step is 1).")

    def prefill_cap(self) -> int:
        """The most prefill tokens for a step that also carries decodes."""
        if self.decode_step_s is None or not self.prefill_token_s:
            return self.first_chunk
        allowance = (self.max_slowdown - 1.0) * self.decode_step_s
        return max(self.min_chunk, int(allowance / self.prefill_token_s))

    def observe(self, num_decodes: int, num_prefill_tokens: int, seconds: float) -> None:
        """Record one step: how many decodes and prefill tokens it ran, and how long it took."""
        if num_prefill_tokens == 0:
            if num_decodes:
                self.decode_step_s = self._mix(self.decode_step_s, seconds)
            return
        # A prefill-only step's time is all prefill (its fixed overhead makes the estimate
        # a little high, which errs toward shorter stalls).
        base = self.decode_step_s if num_decodes and self.decode_step_s is not None else 0.0
        per_token = max(seconds - base, 0.0) / num_prefill_tokens
        self.prefill_token_s = self._mix(self.prefill_token_s, per_token)

    def _mix(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new
