"""Thread statistics: turns, last prompt and completion tokens, first and last seen."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from officellm.app.db.column_types import utcnow
from officellm.app.db.dialect_sql import greatest, least, upsert
from officellm.app.db.records import ThreadInfo
from officellm.app.db.tables import Thread, User
from officellm.app.db.users import UserRef, get_user
from officellm.app.policy.types import ThreadState


def record_thread(session: Session, user_id: int, thread_key: str, turns: int,
                  prompt_tokens: int, completion_tokens: int,
                  seen: datetime | None = None, first_seen: datetime | None = None) -> None:
    """Upsert a thread's latest request: turns and tokens replace the old ones, first_seen keeps
    the earliest time, last_seen takes the latest."""
    seen = seen or utcnow()
    stmt = upsert(session, Thread).values(
        user_id=user_id, thread_key=thread_key, turns=turns, last_prompt_tokens=prompt_tokens,
        last_completion_tokens=completion_tokens, first_seen=first_seen or seen, last_seen=seen)
    session.execute(stmt.on_conflict_do_update(
        index_elements=[Thread.user_id, Thread.thread_key],
        set_={
            "turns": stmt.excluded.turns,
            "last_prompt_tokens": stmt.excluded.last_prompt_tokens,
            "last_completion_tokens": stmt.excluded.last_completion_tokens,
            "first_seen": least(session, Thread.first_seen, stmt.excluded.first_seen),
            "last_seen": greatest(session, Thread.last_seen, stmt.excluded.last_seen),
        },
    ))


def get_thread_state(session: Session, user_id: int, thread_key: str) -> ThreadState | None:
    """What is known of a thread, or None for a new one."""
    row = session.scalar(
        select(Thread).where(Thread.user_id == user_id, Thread.thread_key == thread_key))
    if row is None:
        return None
    return ThreadState(turns=row.turns, last_prompt_tokens=row.last_prompt_tokens,
                       last_completion_tokens=row.last_completion_tokens)


def list_threads(session: Session, user: UserRef | None = None,
                 seen_since: datetime | None = None, limit: int = 200) -> list[ThreadInfo]:
    """Threads, most recently active first (all users or one; optionally only recent ones)."""
    stmt = (select(Thread, User.name).join(User, Thread.user_id == User.id)
            .order_by(Thread.last_seen.desc(), Thread.id.desc()).limit(limit))
    if user is not None:
        stmt = stmt.where(Thread.user_id == get_user(session, user).id)
    if seen_since is not None:
        stmt = stmt.where(Thread.last_seen >= seen_since)
    return [
        ThreadInfo(id=t.id, user_id=t.user_id, user_name=name, thread_key=t.thread_key,
                   turns=t.turns, last_prompt_tokens=t.last_prompt_tokens,
                   last_completion_tokens=t.last_completion_tokens, first_seen=t.first_seen,
                   last_seen=t.last_seen)
        for t, name in session.execute(stmt)
    ]


def active_thread_counts(session: Session, seen_since: datetime) -> dict[str, int]:
    """Threads seen since `seen_since`, per user name (for the active-threads gauge)."""
    stmt = (select(User.name, func.count(Thread.id)).join(User, Thread.user_id == User.id)
            .where(Thread.last_seen >= seen_since).group_by(User.name))
    return {name: count for name, count in session.execute(stmt)}
