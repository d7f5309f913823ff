"""The once-a-second sampler of every model's engine counters: feeds /admin/stats' rates (per
model) and records each burst of preemptions as one `preemption` event (the engine counts
them; the admin reviews them next to the policy refusals). The event names the model and the
user whose requests were preempted most in the burst, and carries every user's count."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from officellm.app.accounts.accounts import Accounts
from officellm.app.observability.model_windows import ModelWindows
from officellm.app.observability.sharing import NameLookup, preemptions_since, user_ids, user_shares
from officellm.app.observability.stats_window import StatsWindow
from officellm.engine import AsyncLLM, EngineStats

logger = logging.getLogger("officellm.server")

SAMPLE_INTERVAL_S = 1.0


Engines = Callable[[], list[tuple[str, AsyncLLM]]]


def sample_once(engine: AsyncLLM, window: StatsWindow, accounts: Accounts,
                names: NameLookup, previous: EngineStats | None,
                model: str | None = None) -> EngineStats | None:
    """Take one snapshot of `model`'s engine; record an event if preemptions happened since
    `previous` (the last call's answer). Returns the snapshot, for the next call."""
    stats = engine.stats()
    if stats is None:  # still loading
        return previous
    preempted = window.add_counters(stats)
    if preempted > 0:
        lookup = names(user_ids(stats) | (user_ids(previous) if previous else set()))
        by_user = preemptions_since(previous, stats, lookup)
        # The user the scheduler took from most: under the fair policy, the one holding the
        # most of the cache for their weight.
        most = max(by_user, key=lambda u: by_user[u]) if by_user else None
        uid = next((i for i, n in lookup.items() if n == most), None)
        holders = user_shares(stats, lookup)
        accounts.record_event("preemption", uid, {
            "count": preempted, "num_preemptions_total": stats.num_preemptions_total,
            "kv_cache_usage": round(stats.kv_cache_usage, 4), "num_running": stats.num_running,
            "num_waiting": stats.num_waiting, "by_user": by_user,
            "scheduling_policy": stats.scheduling_policy, "model": model,
            "heaviest": ({"user": holders[0].user, "kv_share": holders[0].kv_share,
                          "running": holders[0].running} if holders else None)})
    return stats


async def run_sampler(engines: Engines, windows: ModelWindows, accounts: Accounts,
                      names: NameLookup, interval: float = SAMPLE_INTERVAL_S) -> None:
    """Sample every model's engine (`engines()`: name and engine) until cancelled (the app's
    lifespan owns the task)."""
    previous: dict[str, EngineStats | None] = {}
    while True:
        for name, engine in engines():
            try:
                previous[name] = sample_once(engine, windows.of(name), accounts, names,
                                             previous.get(name), name)
            except Exception:  # a sampler bug must not take the server down
                logger.exception("stats sampling failed for %s", name)
        await asyncio.sleep(interval)
