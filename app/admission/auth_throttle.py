"""Failed-authentication throttling per client address.

Keys are random 256-bit secrets, so guessing one is hopeless; but `--api-key` lets an operator
choose a weak static key, and the admin token is worth guessing for. After `limit` refused
tokens from one address within `window_s` seconds, that address gets 429 with Retry-After
until its oldest failure ages out, whatever it sends. A request without any token guesses
nothing and is not counted (a misconfigured scraper must not lock its address out).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from officellm.app.errors import APIError

# Addresses remembered at most; beyond it the stalest are forgotten, so a sweep from many
# addresses cannot grow memory without bound.
MAX_TRACKED = 10_000


class AuthThrottle:
    """Sliding-window counts of refused tokens per client address. Thread-safe: the admin
    routes authenticate on worker threads, the OpenAI routes on the event loop."""

    def __init__(self, limit: int, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit  # 0: never throttle
        self.window_s = window_s
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def check(self, address: str | None) -> None:
        """Raise 429 with Retry-After if `address` has used up its failures."""
        if self.limit <= 0 or address is None:
            return
        with self._lock:
            times = self._recent(address)
            if times is None or len(times) < self.limit:
                return
            retry = max(1, int(times[0] + self.window_s - self._clock()) + 1)
        raise APIError(429, f"Too many failed authentication attempts from this address; retry "
                            f"in {retry} s.", code="too_many_auth_failures",
                       headers={"Retry-After": str(retry)})

    def failed(self, address: str | None) -> None:
        """Count one refused token from `address`."""
        if self.limit <= 0 or address is None:
            return
        with self._lock:
            times = self._recent(address)
            if times is None:
                if len(self._failures) >= MAX_TRACKED:
                    self._forget_stalest()
                times = self._failures[address] = deque()
            times.append(self._clock())

    def _recent(self, address: str) -> deque[float] | None:
        times = self._failures.get(address)
        if times is None:
            return None
        cutoff = self._clock() - self.window_s
        while times and times[0] <= cutoff:
            times.popleft()
        if not times:
            del self._failures[address]
            return None
        return times

    def _forget_stalest(self) -> None:
        stalest = min(self._failures, key=lambda a: self._failures[a][-1])
        del self._failures[stalest]
