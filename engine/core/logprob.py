"""One token's log-probability, as the sampler reports it and the outputs carry it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Logprob:
    """Log-probability of one token, with its rank in the distribution (1 = most likely)."""

    logprob: float
    rank: int
    decoded_token: str | None = None
