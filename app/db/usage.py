"""Daily usage per user (UTC days): requests, prompt and completion tokens."""

from __future__ import annotations

from datetime import date, datetime, timezone

from sqlalchemy import select
from sqlalchemy.orm import Session

from officellm.app.db.dialect_sql import upsert
from officellm.app.db.records import UsageDay
from officellm.app.db.tables import Usage
from officellm.app.db.users import UserRef, get_user


def utc_today(now: datetime | None = None) -> date:
    """The current UTC day (quotas reset at UTC midnight, whatever the office's time zone)."""
    now = now or datetime.now(timezone.utc)
    if now.tzinfo is not None:
        now = now.astimezone(timezone.utc)
    return now.date()


def add_usage(session: Session, user_id: int, day: date, requests: int = 1,
              prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
    """Add to a user's counters for `day` (one upsert)."""
    stmt = upsert(session, Usage).values(user_id=user_id, day=day, requests=requests,
                                prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
    session.execute(stmt.on_conflict_do_update(
        index_elements=[Usage.user_id, Usage.day],
        set_={
            "requests": Usage.requests + stmt.excluded.requests,
            "prompt_tokens": Usage.prompt_tokens + stmt.excluded.prompt_tokens,
            "completion_tokens": Usage.completion_tokens + stmt.excluded.completion_tokens,
        },
    ))


def _record(row: Usage) -> UsageDay:
    return UsageDay(user_id=row.user_id, day=row.day, requests=row.requests,
                    prompt_tokens=row.prompt_tokens, completion_tokens=row.completion_tokens)


def usage_on(session: Session, user_id: int, day: date) -> UsageDay:
    """A user's counters for one day (zeros when they did nothing)."""
    row = session.get(Usage, (user_id, day))
    return _record(row) if row is not None else UsageDay(user_id, day, 0, 0, 0)


def usage_today(session: Session, user_id: int, now: datetime | None = None) -> UsageDay:
    """A user's counters for the current UTC day, as committed (see UsageWriter.pending_tokens
    for what is still queued)."""
    return usage_on(session, user_id, utc_today(now))


def list_usage(session: Session, user: UserRef | None = None, since: date | None = None,
               limit: int = 1000) -> list[UsageDay]:
    """Usage rows, newest day first (all users, or one), optionally from `since` on."""
    stmt = select(Usage).order_by(Usage.day.desc(), Usage.user_id).limit(limit)
    if user is not None:
        stmt = stmt.where(Usage.user_id == get_user(session, user).id)
    if since is not None:
        stmt = stmt.where(Usage.day >= since)
    return [_record(r) for r in session.scalars(stmt)]
