"""A stream's heartbeats: while a request waits for its first token (a long prompt's prefill
on a CPU takes minutes), a client that hears nothing gives up (Claude Code aborts a stream
silent for 5 minutes); so the stream says something every few seconds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")

# Anthropic's API pings about this often; well inside any client's idle timeout.
HEARTBEAT_INTERVAL_S = 10.0


async def with_heartbeats(source: AsyncIterator[T],
                          interval: float | None = None) -> AsyncIterator[T | None]:
    """`source`'s items, and None after every `interval` seconds (HEARTBEAT_INTERVAL_S,
    read at each call) without one."""
    if interval is None:
        interval = HEARTBEAT_INTERVAL_S
    pending: asyncio.Future[T] = asyncio.ensure_future(anext(source))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield None
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            yield item
            pending = asyncio.ensure_future(anext(source))
    finally:
        pending.cancel()
