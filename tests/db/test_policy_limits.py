"""Concurrency limiter and daily quota: 429 decisions with Retry-After."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import pytest

from app.admission.concurrency import ConcurrencyLimiter
from app.policy.limits import check_daily_quota, seconds_until_utc_midnight
from app.policy.types import EffectivePolicy


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


def test_concurrency_limiter_counts_per_user() -> None:
    lim = ConcurrencyLimiter(retry_after=3)
    assert lim.try_acquire("alice", 2).allowed
    assert lim.try_acquire("alice", 2).allowed
    d = lim.try_acquire("alice", 2)
    assert d.action == "reject" and d.status == 429 and d.retry_after == 3
    assert d.reason == "max_concurrent_requests"
    assert d.message == ("You already have 2 requests running, your limit is 2. "
                         "Please wait for one to finish.")
    assert lim.try_acquire("bob", 2).allowed  # other users are unaffected
    lim.release("alice")
    assert lim.try_acquire("alice", 2).allowed
    assert lim.snapshot() == {"alice": 2, "bob": 1}
    assert lim.try_acquire("carol", None).allowed  # no limit
    with pytest.raises(RuntimeError):
        lim.release("nobody")


def test_slot_releases_on_exit_and_on_error() -> None:
    lim = ConcurrencyLimiter()
    with lim.slot("u", 1) as d:
        assert d.allowed and lim.active("u") == 1
        with lim.slot("u", 1) as inner:
            assert not inner.allowed
        assert lim.active("u") == 1  # a refused slot gives nothing back
    assert lim.active("u") == 0
    with pytest.raises(KeyError), lim.slot("u", 1):
        raise KeyError("boom")
    assert lim.active("u") == 0


def test_concurrency_limiter_under_asyncio() -> None:
    lim = ConcurrencyLimiter()
    running = 0
    peak = 0
    refused = 0

    async def request() -> None:
        nonlocal running, peak, refused
        with lim.slot("alice", 3) as d:
            if not d.allowed:
                refused += 1
                return
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1

    async def main() -> None:
        await asyncio.gather(*(request() for _ in range(20)))

    asyncio.run(main())
    assert peak == 3 and refused == 17 and lim.active("alice") == 0
