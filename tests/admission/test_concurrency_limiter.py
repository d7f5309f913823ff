"""Running requests per user: the 429 of one request too many, and releases."""

from __future__ import annotations

import asyncio

import pytest

from officellm.app.admission.concurrency import ConcurrencyLimiter


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
