"""The once-a-second sampler of engine counters: feeds /admin/stats' rates and records each
burst of preemptions as one `preemption` event (the engine counts them; the admin reviews
them next to the policy refusals)."""

from __future__ import annotations

import asyncio
import logging

from app.accounts.accounts import Accounts
from app.observability.stats_window import StatsWindow
from app.serving.async_engine import AsyncEngine

logger = logging.getLogger("officellm.server")

SAMPLE_INTERVAL_S = 1.0


def sample_once(engine: AsyncEngine, window: StatsWindow, accounts: Accounts) -> None:
    """Take one snapshot; record an event if preemptions happened since the last one."""
    stats = engine.stats()
    if stats is None:  # still loading
        return
    preempted = window.add_counters(stats)
    if preempted > 0:
        # The engine does not say whose request was preempted (it evicts the newest), so the
        # event carries the count and the pool's state, not a user.
        accounts.record_event("preemption", None, {
            "count": preempted, "num_preemptions_total": stats.num_preemptions_total,
            "kv_cache_usage": round(stats.kv_cache_usage, 4), "num_running": stats.num_running,
            "num_waiting": stats.num_waiting})


async def run_sampler(engine: AsyncEngine, window: StatsWindow, accounts: Accounts,
                      interval: float = SAMPLE_INTERVAL_S) -> None:
    """Sample until cancelled (the app's lifespan owns the task)."""
    while True:
        try:
            sample_once(engine, window, accounts)
        except Exception:  # a sampler bug must not take the server down
            logger.exception("stats sampling failed")
        await asyncio.sleep(interval)
