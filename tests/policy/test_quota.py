"""The daily quota: a 429 decision with Retry-After until UTC midnight."""

from __future__ import annotations

from datetime import datetime, timezone

from officellm.app.policy.limits import check_daily_quota, seconds_until_utc_midnight
from officellm.app.policy.types import EffectivePolicy


def test_seconds_until_utc_midnight() -> None:
    assert seconds_until_utc_midnight(datetime(2025, 3, 1, 23, 59, 30, tzinfo=timezone.utc)) == 30
    assert seconds_until_utc_midnight(datetime(2025, 3, 1, 0, 0, 0, tzinfo=timezone.utc)) == 86400
    assert seconds_until_utc_midnight(datetime(2025, 3, 1, 12, 0, 0, 500000,
                                               tzinfo=timezone.utc)) == 43200
    # Another zone's wall clock is converted: 20:00 in UTC-5 is 01:00 UTC next day.
    from datetime import timedelta
    est = timezone(timedelta(hours=-5))
    assert seconds_until_utc_midnight(datetime(2025, 3, 1, 20, 0, tzinfo=est)) == 23 * 3600


def test_daily_quota() -> None:
    now = datetime(2025, 3, 1, 18, 0, tzinfo=timezone.utc)
    policy = EffectivePolicy(max_tokens_per_day=100_000)
    assert check_daily_quota(policy, 99_999, now).action == "allow"
    d = check_daily_quota(policy, 100_250, now)
    assert d.action == "reject" and d.status == 429 and d.reason == "max_tokens_per_day"
    assert d.retry_after == 6 * 3600
    assert d.message == ("You have used 100,250 tokens today, your daily limit is 100,000. "
                         "It resets at midnight UTC.")
    assert check_daily_quota(EffectivePolicy(), 10**9, now).action == "allow"
