"""Rate limits: concurrent requests per user (in process) and tokens per UTC day."""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

from app.policy.messages import concurrency_message, daily_quota_message
from app.policy.types import Decision, EffectivePolicy


def seconds_until_utc_midnight(now: datetime | None = None) -> int:
    """Whole seconds (at least 1) until the next UTC midnight, when daily quotas reset."""
    now = now or datetime.now(timezone.utc)
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    now = now.astimezone(timezone.utc)
    midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return max(1, math.ceil((midnight - now).total_seconds()))


def check_daily_quota(policy: EffectivePolicy, tokens_used_today: int,
                      now: datetime | None = None) -> Decision:
    """429 once the user's tokens today (prompt + completion) reach max_tokens_per_day.

    A request that starts under the quota runs to completion even if it ends over it: its size
    is unknown beforehand, and cutting a reply off mid-sentence helps nobody.
    """
    limit = policy.max_tokens_per_day
    if limit is None or tokens_used_today < limit:
        return Decision("allow")
    return Decision("reject", message=daily_quota_message(tokens_used_today, limit), status=429,
                    reason="max_tokens_per_day", retry_after=seconds_until_utc_midnight(now))


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
            if limit is not None and active >= limit:
                return Decision("reject", message=concurrency_message(active, limit), status=429,
                                reason="max_concurrent_requests", retry_after=self.retry_after)
            self._active[user] = active + 1
        return Decision("allow")

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
