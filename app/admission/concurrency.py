"""Running requests per user, counted in this process (the state behind
app.policy.limits.check_concurrency)."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator
from contextlib import contextmanager

from officellm.app.policy.limits import check_concurrency
from officellm.app.policy.types import Decision


class ConcurrencyLimiter:
    """Counts each user's running requests; refuses the one over max_concurrent_requests.

    A lock (not an asyncio primitive) guards the counters, and it is never held across an
    await: safe from the event loop and from worker threads alike.
    """

    def __init__(self, retry_after: int = 2) -> None:
        self.retry_after = retry_after
        self._lock = threading.Lock()
        self._active: dict[Hashable, int] = {}

    def try_acquire(self, user: Hashable, limit: int | None) -> Decision:
        """Take a slot for `user`: allow (then release() it when done) or a 429 decision."""
        with self._lock:
            active = self._active.get(user, 0)
            decision = check_concurrency(active, limit, self.retry_after)
            if decision.allowed:
                self._active[user] = active + 1
        return decision

    def release(self, user: Hashable) -> None:
        """Give back a slot taken by an allowed try_acquire()."""
        with self._lock:
            active = self._active.get(user, 0)
            if active <= 0:
                raise RuntimeError(f"release() without a slot for {user!r}")
            if active == 1:
                del self._active[user]
            else:
                self._active[user] = active - 1

    @contextmanager
    def slot(self, user: Hashable, limit: int | None) -> Iterator[Decision]:
        """`with limiter.slot(u, n) as d:` — d is the decision; an allowed slot is released on
        exit. (For streaming, call try_acquire/release around the stream's life instead.)"""
        decision = self.try_acquire(user, limit)
        try:
            yield decision
        finally:
            if decision.allowed:
                self.release(user)

    def active(self, user: Hashable) -> int:
        """The user's running requests."""
        with self._lock:
            return self._active.get(user, 0)

    def snapshot(self) -> dict[Hashable, int]:
        """Running requests per user (for /admin/stats and metrics)."""
        with self._lock:
            return dict(self._active)
