"""Events the admin reviews later: policy refusals, truncations, preemptions, and the admin's
own changes (users, keys, policies) as they happen to a person. Who made a change, with the
values before and after, is the audit log's (app/db/audit.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from officellm.app.db.column_types import utcnow
from officellm.app.db.records import EventInfo
from officellm.app.db.tables import Event


def record_event(session: Session, kind: str, user_id: int | None = None,
                 detail: Any = None, time: datetime | None = None) -> None:
    """Add an event; `detail` is any JSON-able value (never message content)."""
    session.add(Event(kind=kind, user_id=user_id, detail=detail, time=time or utcnow()))


def recent_events(session: Session, limit: int = 100, user_id: int | None = None,
                  kind: str | None = None, since: datetime | None = None) -> list[EventInfo]:
    """The newest events first, optionally of one user, one kind, or from `since` on."""
    stmt = select(Event).order_by(Event.time.desc(), Event.id.desc()).limit(limit)
    if user_id is not None:
        stmt = stmt.where(Event.user_id == user_id)
    if kind is not None:
        stmt = stmt.where(Event.kind == kind)
    if since is not None:
        stmt = stmt.where(Event.time >= since)
    return [EventInfo(id=e.id, time=e.time, kind=e.kind, user_id=e.user_id, detail=e.detail)
            for e in session.scalars(stmt)]
