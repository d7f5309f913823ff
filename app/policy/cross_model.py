"""A person's share counted across models: heavy use of one model lowers their fair-share
weight on the others.

Each model's engine runs its own fair scheduler (docs/design.md §2) and sees only the
service it gave each key, so by itself a person busy on model A would still come first on
model B. The server therefore remembers each user's recent tokens per model (prompt plus
completion, decayed with a half-life of CROSS_MODEL_HALF_LIFE_S seconds) and, when it tags a
request for model B, divides the user's weight by 1 + h, where h is the user's recent
tokens on the *other* models over the mean recent tokens (all models) of the users served
recently; h is capped at MAX_ELSEWHERE so the weight never falls below a third of the
policy's. Two people who used the other models alike get the same factor, so their order on
B is the engine's own; a person who used nothing elsewhere keeps their weight.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from officellm.app.policy.scheduling import SchedulingTags

CROSS_MODEL_HALF_LIFE_S = 300.0
# h's cap: a person's weight on one model falls at most to 1 / (1 + 2) of their policy's, so
# work elsewhere never starves them here.
MAX_ELSEWHERE = 2.0
# Decayed tokens below which a (user, model) entry is forgotten.
FORGET_BELOW = 1.0


def elsewhere_factor(elsewhere_tokens: float, mean_user_tokens: float) -> float:
    """The multiplier of a user's weight on one model: 1 / (1 + h), h = their recent tokens
    on the other models over the mean recent tokens of the users served recently (capped at
    MAX_ELSEWHERE)."""
    if elsewhere_tokens <= 0 or mean_user_tokens <= 0:
        return 1.0
    return 1.0 / (1.0 + min(MAX_ELSEWHERE, elsewhere_tokens / mean_user_tokens))


def cross_model_tags(tags: SchedulingTags, factor: float) -> SchedulingTags:
    """`tags` with the priority weight scaled by elsewhere_factor()'s answer."""
    return replace(tags, priority=tags.priority * factor)


class CrossModelService:
    """Each user's recent tokens per model, decayed over time (thread-safe: requests end on
    the event loop, admission reads on it too, tests call it from anywhere)."""

    def __init__(self, half_life_s: float = CROSS_MODEL_HALF_LIFE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if half_life_s <= 0:
            raise ValueError("half_life_s must be positive.")
        self.half_life_s = half_life_s
        self._clock = clock
        self._lock = threading.Lock()
        # (user_id, model) -> (decayed tokens, the time they were brought up to date)
        self._tokens: dict[tuple[int, str], tuple[float, float]] = {}

    def record(self, user_id: int, model: str, tokens: int) -> None:
        """`tokens` of work done for `user_id` on `model` (a request's prompt + completion)."""
        if tokens <= 0:
            return
        now = self._clock()
        with self._lock:
            self._tokens[(user_id, model)] = (self._decayed(user_id, model, now) + tokens, now)

    def factor(self, user_id: int, model: str) -> float:
        """The multiplier of `user_id`'s weight on `model` (elsewhere_factor())."""
        now = self._clock()
        with self._lock:
            per_user: dict[int, float] = {}
            elsewhere = 0.0
            for (uid, name) in list(self._tokens):
                tokens = self._decayed(uid, name, now)
                if tokens < FORGET_BELOW:
                    del self._tokens[(uid, name)]
                    continue
                per_user[uid] = per_user.get(uid, 0.0) + tokens
                if uid == user_id and name != model:
                    elsewhere += tokens
        mean = sum(per_user.values()) / len(per_user) if per_user else 0.0
        return elsewhere_factor(elsewhere, mean)

    def _decayed(self, user_id: int, model: str, now: float) -> float:  # with the lock held
        tokens, since = self._tokens.get((user_id, model), (0.0, now))
        return tokens * math.pow(0.5, max(0.0, now - since) / self.half_life_s)
