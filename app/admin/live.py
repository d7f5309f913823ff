"""GET /admin/stats (live numbers) and GET /admin/plan (the KV arithmetic for the loaded model;
POST /admin/plan, the same for a model of the asker's choice, is app/admin/what_if.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict

from fastapi import APIRouter, Request

from officellm.app.admin.activity import threads_with_caps
from officellm.app.admin.views import (
    ActiveThread,
    EmbeddingStats,
    ModelStats,
    Plan,
    Stats,
    UserShareView,
)
from officellm.app.db import get_effective_policy, list_threads
from officellm.app.db.column_types import utcnow
from officellm.app.db.users import user_names
from officellm.app.errors import unavailable
from officellm.app.models.served_model import ServedModel
from officellm.app.observability.sharing import user_ids, user_shares
from officellm.app.observability.stats_window import StatsWindow
from officellm.app.policy import prefix_cache_salt
from officellm.app.server_settings import ACTIVE_THREAD_MINUTES
from officellm.app.serving.state import ServerState
from officellm.engine import kv_disk_owner

router = APIRouter()


def _server(request: Request) -> ServerState:
    return request.app.state.server


@router.get("/stats")
def get_stats(request: Request) -> Stats:
    server = _server(request)
    default = server.default_model
    stats = default.async_engine.stats()
    server.accounts.writer.flush()  # threads include the request answered a moment ago
    with server.accounts.db.session() as session:
        threads = threads_with_caps(server, session, active_minutes=ACTIVE_THREAD_MINUTES)
        shares = (user_shares(stats, user_names(session, user_ids(stats)),
                              _disk_owner(server)) if stats is not None else [])
    return Stats(
        model=server.model_name,
        uptime_s=round(time.monotonic() - server.started_monotonic, 3),
        ready=default.async_engine.is_ready,
        state=default.state,
        engine=stats,
        rates=server.stats_windows.of(default.name).rates(),
        latency=server.stats_windows.of(default.name).latency(),
        active_threads=[ActiveThread(**t.model_dump(include=set(ActiveThread.model_fields)))
                        for t in threads],
        users=[UserShareView(**asdict(u)) for u in shares],
        structured_requests=dict(server.metrics.structured_by_kind),
        embeddings=_embedding_stats(server),
        models=[_model_stats(m, server.stats_windows.of(m.name))
                for m in server.models.models if m.name],
    )


def _disk_owner(server: ServerState) -> Callable[[int], str] | None:
    """A user id's folder in the KV disk tier (their own prefix-cache salt's), if there is a
    tier."""
    key = server.settings.engine.kv_disk_key
    if key is None:
        return None
    return lambda user_id: kv_disk_owner(key, prefix_cache_salt(user_id, share_prefix_cache=False))


def _model_stats(model: ServedModel, window: StatsWindow) -> ModelStats:
    """One generate model's state, KV pool (the console's gauge per model), and its rates
    and latencies over the recent window."""
    stats = model.async_engine.stats() if model.in_memory else None
    return ModelStats(
        name=model.name, state=model.state,
        kv_cache_usage=stats.kv_cache_usage if stats is not None else None,
        num_blocks_total=stats.num_blocks_total if stats is not None else None,
        num_blocks_used=stats.num_blocks_used if stats is not None else None,
        num_running=stats.num_running if stats is not None else 0,
        num_waiting=stats.num_waiting if stats is not None else 0,
        kv_host=stats.kv_host if stats is not None else None,
        kv_disk=stats.kv_disk if stats is not None else None,
        kv_tier_hits=stats.kv_tier_hits if stats is not None else 0,
        rates=window.rates(), latency=window.latency())


def _embedding_stats(server: ServerState) -> EmbeddingStats | None:
    """The first embedding model's totals (--embedding-model's when given)."""
    if not server.models.embedders:
        return None
    served = server.models.embedders[0]
    return EmbeddingStats(model=served.name, state=served.state,
                          **asdict(served.embedder.stats()))


@router.get("/plan")
def get_plan(request: Request) -> Plan:
    """docs/design.md §4's arithmetic on the live pool: how many threads of today's average
    length, of the default cap and of the max model length fit. (The pool's size is the
    engine's, not an estimate.) The console's Capacity tab shows this answer as it is."""
    server = _server(request)
    default = server.default_model
    stats = default.async_engine.stats()
    if stats is None:  # not loaded (yet, or ever): say which
        raise unavailable(default.async_engine.unavailable_reason(),
                          server.settings.retry_after_s)
    server.accounts.writer.flush()
    with server.accounts.db.session() as session:
        today = utcnow().replace(hour=0, minute=0, second=0, microsecond=0)
        lengths = [t.length for t in list_threads(session, seen_since=today, limit=100_000)
                   if t.length > 0]
        cap = default.context_cap(get_effective_policy(session, None).max_context_tokens)
    pool_tokens = stats.kv_cache_tokens
    avg = round(sum(lengths) / len(lengths)) if lengths else None
    cap_or_len = cap if cap is not None else stats.max_model_len
    return Plan(
        model=server.model_name,
        bytes_per_token=stats.bytes_per_token,
        kv_cache_dtype=stats.kv_cache_dtype,
        kv_cache_tokens=pool_tokens,
        kv_cache_bytes=stats.kv_cache_bytes,
        num_blocks=stats.num_blocks_total,
        block_size=stats.block_size,
        max_model_len=stats.max_model_len,
        avg_thread_tokens=avg,
        threads_at_avg=round(stats.requests_that_fit(avg), 2) if avg else None,
        threads_at_cap=round(stats.requests_that_fit(cap_or_len), 2) if cap_or_len else None,
        threads_at_max_len=(round(stats.requests_that_fit(stats.max_model_len), 2)
                            if stats.max_model_len else None),
        cap=cap,
    )

