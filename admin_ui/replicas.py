"""The replicas sharing the console's server's database, each with its live numbers: the
list from `/admin/replicas`, then each live replica's `/admin/stats` with the same admin
token (one token for all replicas: docs/cluster.md). No Qt here: the tab runs `survey` on a
worker thread."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from officellm.admin_ui.admin_client import AdminClient, AdminError
from officellm.admin_ui.snapshot import EngineNumbers


@dataclass(frozen=True)
class ReplicaRow:
    """One replica: what /admin/replicas says of it, and its engine's numbers (None when it
    is stale or did not answer; `error` says why it did not)."""

    name: str
    url: str
    model: str | None
    heartbeat_age_s: float
    stale: bool
    draining: bool
    this: bool
    engine: EngineNumbers | None = None
    error: str | None = None

    @property
    def state(self) -> str:
        if self.stale:
            return "stale"
        if self.draining:
            return "draining"
        return "unreachable" if self.engine is None else "live"


@dataclass(frozen=True)
class ReplicaTotals:
    """The "All" view: the live replicas' pools and work, summed."""

    replicas: int
    blocks_used: int
    blocks_total: int
    running: int
    waiting: int

    @property
    def kv_usage(self) -> float:
        return self.blocks_used / self.blocks_total if self.blocks_total else 0.0


def survey(client: AdminClient,
           connect: Callable[[str, str | None], AdminClient] = AdminClient) -> list[ReplicaRow]:
    """Every replica, with the numbers of those that answer (blocking: a worker's job)."""
    rows = []
    for r in client.replicas():
        engine, error = None, None
        if not r.get("stale"):
            engine, error = _engine(r, client, connect)
        rows.append(ReplicaRow(name=str(r["name"]), url=str(r["url"]), model=r.get("model"),
                               heartbeat_age_s=float(r.get("heartbeat_age_s") or 0.0),
                               stale=bool(r.get("stale")), draining=bool(r.get("draining")),
                               this=bool(r.get("this")), engine=engine, error=error))
    return rows


def _engine(replica: dict[str, Any], client: AdminClient,
            connect: Callable[[str, str | None], AdminClient]
            ) -> tuple[EngineNumbers | None, str | None]:
    other = client if replica.get("this") else connect(str(replica["url"]), client.token)
    try:
        return EngineNumbers.from_json(other.stats().get("engine") or {}), None
    except AdminError as exc:
        return None, str(exc)
    finally:
        if other is not client:
            other.close()


def totals(rows: Sequence[ReplicaRow]) -> ReplicaTotals:
    """The live replicas' numbers, summed."""
    live = [r.engine for r in rows if r.engine is not None]
    return ReplicaTotals(replicas=len(live),
                         blocks_used=sum(e.num_blocks_used for e in live),
                         blocks_total=sum(e.num_blocks_total for e in live),
                         running=sum(e.num_running for e in live),
                         waiting=sum(e.num_waiting for e in live))
