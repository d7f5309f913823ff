"""The replicas sharing the console's server's database, each with its live numbers: the
list from `/admin/replicas`, then each live replica's `/admin/stats` with the same admin
token (one token for all replicas: docs/cluster.md). A view is all live replicas summed or
one of them: its pool (`totals`) and its people's hold on it (`people`), each person with
the replica they are on. No Qt here: the tab runs `survey` on a worker thread."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from officellm.admin_ui.admin_client import AdminClient, AdminError
from officellm.admin_ui.snapshot import EngineNumbers, StatsSnapshot, UserShare

ALL = None  # the view of every live replica, summed


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
    users: tuple[UserShare, ...] = ()  # its people's hold on its pool, when it answered
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
        stats, error = None, None
        if not r.get("stale"):
            stats, error = _stats(r, client, connect)
        rows.append(ReplicaRow(name=str(r["name"]), url=str(r["url"]), model=r.get("model"),
                               heartbeat_age_s=float(r.get("heartbeat_age_s") or 0.0),
                               stale=bool(r.get("stale")), draining=bool(r.get("draining")),
                               this=bool(r.get("this")),
                               engine=None if stats is None else stats.engine,
                               users=() if stats is None else tuple(stats.users), error=error))
    return rows


def _stats(replica: dict[str, Any], client: AdminClient,
           connect: Callable[[str, str | None], AdminClient]
           ) -> tuple[StatsSnapshot | None, str | None]:
    other = client if replica.get("this") else connect(str(replica["url"]), client.token)
    try:
        return StatsSnapshot.from_json(other.stats()), None
    except AdminError as exc:
        return None, str(exc)
    finally:
        if other is not client:
            other.close()


def _view(rows: Sequence[ReplicaRow], replica: str | None) -> list[ReplicaRow]:
    """The replicas that answered, of the view: all of them (ALL) or the one named."""
    return [r for r in rows if r.engine is not None and replica in (ALL, r.name)]


def totals(rows: Sequence[ReplicaRow], replica: str | None = ALL) -> ReplicaTotals:
    """The view's numbers: the live replicas' summed (ALL), or the one named."""
    live = [r.engine for r in _view(rows, replica) if r.engine is not None]
    return ReplicaTotals(replicas=len(live),
                         blocks_used=sum(e.num_blocks_used for e in live),
                         blocks_total=sum(e.num_blocks_total for e in live),
                         running=sum(e.num_running for e in live),
                         waiting=sum(e.num_waiting for e in live))


@dataclass(frozen=True)
class PersonShare:
    """One person's hold on a view's pool: KV blocks held now and their share of the view's
    blocks, running requests, preemptions since each replica started, and the replicas they
    are on (one, behind a router that pins people; more while a person moves)."""

    user: str
    replicas: tuple[str, ...]
    kv_blocks: int
    kv_share: float
    running: int
    preemptions_total: int


def people(rows: Sequence[ReplicaRow], replica: str | None = ALL) -> list[PersonShare]:
    """Each person holding KV or running in the view (ALL, or the replica named), the
    heaviest holder first: one person's numbers on several replicas are summed, and their
    share is of the view's whole pool."""
    view = _view(rows, replica)
    pool = totals(rows, replica).blocks_total
    held: dict[str, list[tuple[str, UserShare]]] = {}
    for r in view:
        for u in r.users:
            held.setdefault(u.user, []).append((r.name, u))
    out = []
    for user, shares in held.items():
        blocks = sum(u.kv_blocks for _, u in shares)
        out.append(PersonShare(user=user, replicas=tuple(name for name, _ in shares),
                               kv_blocks=blocks, kv_share=blocks / pool if pool else 0.0,
                               running=sum(u.running for _, u in shares),
                               preemptions_total=sum(u.preemptions_total for _, u in shares)))
    return sorted(out, key=lambda p: (-p.kv_blocks, -p.running, p.user))
