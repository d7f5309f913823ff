"""The Replicas table: one row per server sharing the database, its KV pool and work."""

from __future__ import annotations

from officellm.admin_ui.models.record_table import Column, RecordTableModel
from officellm.admin_ui.replicas import ReplicaRow


def _kv(r: ReplicaRow) -> str:
    e = r.engine
    if e is None or not e.num_blocks_total:
        return "-"
    return f"{e.num_blocks_used:,} / {e.num_blocks_total:,} blocks ({e.kv_cache_usage:.0%})"


def _count(r: ReplicaRow, name: str) -> str:
    return "-" if r.engine is None else str(getattr(r.engine, name))


class ReplicasModel(RecordTableModel[ReplicaRow]):
    columns = [
        Column("Replica", lambda r: r.name + (" (this one)" if r.this else "")),
        Column("State", lambda r: r.state, tooltip=lambda r: r.error or r.state),
        Column("Model", lambda r: r.model or "-"),
        Column("KV cache", _kv, sort_key=lambda r: r.engine.kv_cache_usage if r.engine else -1.0),
        Column("Running", lambda r: _count(r, "num_running"),
               sort_key=lambda r: r.engine.num_running if r.engine else -1, numeric=True),
        Column("Waiting", lambda r: _count(r, "num_waiting"),
               sort_key=lambda r: r.engine.num_waiting if r.engine else -1, numeric=True),
        Column("Heartbeat", lambda r: f"{r.heartbeat_age_s:.0f} s ago",
               sort_key=lambda r: r.heartbeat_age_s, numeric=True),
        Column("URL", lambda r: r.url),
    ]
