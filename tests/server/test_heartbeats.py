"""A stream says something while its first token is slow to come (app/serving/heartbeats.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from officellm.app.serving.heartbeats import with_heartbeats


async def _slow(delays: list[float]) -> AsyncIterator[int]:
    for i, delay in enumerate(delays):
        await asyncio.sleep(delay)
        yield i


def _collect(delays: list[float], interval: float) -> list[int | None]:
    async def run() -> list[int | None]:
        return [item async for item in with_heartbeats(_slow(delays), interval)]
    return asyncio.run(run())


def test_a_silence_longer_than_the_interval_gets_heartbeats_between_the_items():
    got = _collect([0.35, 0.0], interval=0.1)
    assert got[-2:] == [0, 1] and got[:-2] == [None] * len(got[:-2])
    assert 2 <= len(got) - 2 <= 4  # about one per interval of the 0.35 s wait


def test_items_that_come_quickly_get_no_heartbeat():
    assert _collect([0.0, 0.01, 0.0], interval=0.5) == [0, 1, 2]
