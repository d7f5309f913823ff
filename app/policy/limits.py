"""Rate limits as rules: the daily token quota, and the refusal of one request too many."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

from officellm.app.policy.messages import concurrency_message, daily_quota_message
from officellm.app.policy.types import Decision, EffectivePolicy


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




def check_concurrency(active: int, limit: int | None, retry_after: int) -> Decision:
    """429 when the user already runs `limit` requests."""
    if limit is None or active < limit:
        return Decision("allow")
    return Decision("reject", message=concurrency_message(active, limit), status=429,
                    reason="max_concurrent_requests", retry_after=retry_after)
