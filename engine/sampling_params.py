"""Per-request generation settings, in vLLM's shape."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_TOP_LOGPROBS = 20
MAX_N = 16
# Integers the sampler hands to torch: a seed seeds a torch.Generator (64 bits) and top_k
# becomes an int64 tensor. Beyond these a request would fail inside the engine, and take the
# rest of its batch with it, instead of getting a 400.
SEED_RANGE = (-(2**63), 2**63 - 1)
MAX_TOP_K = 2**31 - 1


@dataclass
class SamplingParams:
    """How one request samples and when it stops.

    temperature == 0 means greedy. `stop` strings are matched on the detokenized text and cut
    from the output; `stop_token_ids` end generation like EOS does. `logprobs=k` returns the
    chosen token's log-probability plus the top k alternatives (of the raw model distribution).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k is None or self.top_k < 0:
            self.top_k = 0
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field."""
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}.")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise ValueError(f"seed must be a 64-bit integer, got {self.seed}.")
        if self.top_k > MAX_TOP_K:
            raise ValueError(f"top_k must be at most {MAX_TOP_K}, got {self.top_k}.")
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be between 1 and {MAX_N}, got {self.n}.")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        if not -2 <= self.presence_penalty <= 2:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not -2 <= self.frequency_penalty <= 2:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be positive, got {self.repetition_penalty}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be non-negative, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})."
            )
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(
                f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {self.logprobs}."
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def uses_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )
