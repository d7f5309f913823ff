"""The replicas sharing this database: each registers at start, then beats every few seconds
(app/serving/replica_heartbeat.py); one that has missed its beats is stale."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from officellm.app.db.column_types import utcnow
from officellm.app.db.records import ReplicaInfo
from officellm.app.db.tables import Replica

# A replica beats this often; after missing STALE_AFTER_BEATS beats it is listed as stale.
HEARTBEAT_INTERVAL_S = 5.0
STALE_AFTER_BEATS = 3


def register_replica(session: Session, name: str, url: str, now: datetime | None = None
                     ) -> None:
    """This replica, starting: a new row, or its old row renewed (a restart, same name)."""
    now = now or utcnow()
    replica = session.get(Replica, name) or Replica(name=name)
    replica.url, replica.model, replica.draining = url, None, False
    replica.started = replica.heartbeat = now
    session.add(replica)


def beat(session: Session, name: str, model: str | None, draining: bool = False,
         now: datetime | None = None) -> bool:
    """This replica is alive, serving `model` (None while it loads), draining or not. False
    when its row is gone (deleted by hand while it ran): it should register again."""
    replica = session.get(Replica, name)
    if replica is None:
        return False
    replica.heartbeat, replica.model, replica.draining = now or utcnow(), model, draining
    return True


def list_replicas(session: Session, now: datetime | None = None) -> list[ReplicaInfo]:
    """Every replica that has registered, by name, with its heartbeat's age."""
    now = now or utcnow()
    stale_after = HEARTBEAT_INTERVAL_S * STALE_AFTER_BEATS
    out = []
    for r in session.scalars(select(Replica).order_by(Replica.name)):
        age = max(0.0, (now - r.heartbeat).total_seconds())
        out.append(ReplicaInfo(name=r.name, url=r.url, model=r.model, started=r.started,
                               heartbeat=r.heartbeat, draining=r.draining,
                               heartbeat_age_s=round(age, 1), stale=age > stale_after))
    return out
