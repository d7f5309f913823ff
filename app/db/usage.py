"""Usage per user, per model, per UTC day: requests, tokens and engine time; and the reports
the admin reads from it (by user, by model or by day). Never any message content."""

from __future__ import annotations

from dataclasses import fields
from datetime import date, datetime, timedelta, timezone
from typing import Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from officellm.app.db.dialect_sql import upsert
from officellm.app.db.records import UsageCounts, UsageDay, UsageReportRow
from officellm.app.db.tables import MODEL_NAME_LENGTH, Usage, User
from officellm.app.db.users import UserRef, get_user

# The counters, named as UsageCounts' fields and the usage table's columns alike.
COUNTERS = tuple(f.name for f in fields(UsageCounts))
FLOAT_COUNTERS = tuple(f.name for f in fields(UsageCounts) if f.type in (float, "float"))

ReportBy = Literal["user", "model", "day"]
REPORT_BY: tuple[ReportBy, ...] = ("user", "model", "day")
# A report's default span, and its longest (ten years; beyond it dates overflow soon).
DEFAULT_REPORT_DAYS = 30
MAX_REPORT_DAYS = 3660


def utc_today(now: datetime | None = None) -> date:
    """The current UTC day (quotas reset at UTC midnight, whatever the office's time zone)."""
    now = now or datetime.now(timezone.utc)
    if now.tzinfo is not None:
        now = now.astimezone(timezone.utc)
    return now.date()


def usage_model_name(model: str) -> str:
    """The name a usage row keeps for a served model (cut to the column's length)."""
    return model[:MODEL_NAME_LENGTH]


def add_usage(session: Session, user_id: int, day: date, model: str,
              counts: UsageCounts) -> None:
    """Add `counts` to a user's row for `model` on `day` (one upsert)."""
    values = {c: getattr(counts, c) for c in COUNTERS}
    stmt = upsert(session, Usage).values(user_id=user_id, day=day,
                                         model=usage_model_name(model), **values)
    session.execute(stmt.on_conflict_do_update(
        index_elements=[Usage.user_id, Usage.day, Usage.model],
        set_={c: getattr(Usage, c) + getattr(stmt.excluded, c) for c in COUNTERS},
    ))


def usage_on(session: Session, user_id: int, day: date) -> UsageDay:
    """A user's counters for one day over every model (zeros when they did nothing)."""
    requests, prompt, completion = session.execute(
        select(func.coalesce(func.sum(Usage.requests), 0),
               func.coalesce(func.sum(Usage.prompt_tokens), 0),
               func.coalesce(func.sum(Usage.completion_tokens), 0))
        .where(Usage.user_id == user_id, Usage.day == day)).one()
    return UsageDay(user_id, day, int(requests), int(prompt), int(completion))


def audio_seconds_on(session: Session, user_id: int, day: date) -> float:
    """A user's seconds of audio transcribed or translated on one day, every model."""
    seconds = session.scalar(select(func.coalesce(func.sum(Usage.audio_seconds), 0.0))
                             .where(Usage.user_id == user_id, Usage.day == day))
    return float(seconds or 0.0)


def usage_today(session: Session, user_id: int, now: datetime | None = None) -> UsageDay:
    """A user's counters for the current UTC day, as committed (see UsageWriter.pending_tokens
    for what is still queued)."""
    return usage_on(session, user_id, utc_today(now))


def list_usage(session: Session, user: UserRef | None = None, since: date | None = None,
               limit: int = 1000) -> list[UsageDay]:
    """Per user per day over every model, newest day first (all users, or one), optionally
    from `since` on."""
    stmt = (select(Usage.user_id, Usage.day, func.sum(Usage.requests),
                   func.sum(Usage.prompt_tokens), func.sum(Usage.completion_tokens))
            .group_by(Usage.user_id, Usage.day)
            .order_by(Usage.day.desc(), Usage.user_id).limit(limit))
    if user is not None:
        stmt = stmt.where(Usage.user_id == get_user(session, user).id)
    if since is not None:
        stmt = stmt.where(Usage.day >= since)
    return [UsageDay(uid, day, int(r), int(p), int(c)) for uid, day, r, p, c in session.execute(stmt)]


def report_range(since: date | None, until: date | None,
                 days: int = DEFAULT_REPORT_DAYS) -> tuple[date, date]:
    """A report's first and last UTC day: `until` defaults to today, `since` to `days` days
    up to `until`. ValueError for a range that runs backwards or spans over MAX_REPORT_DAYS."""
    if not 1 <= days <= MAX_REPORT_DAYS:
        raise ValueError(f"days must be 1 to {MAX_REPORT_DAYS}, not {days}")
    until = until or utc_today()
    if since is None:
        if (until - date.min).days < days - 1:  # before year 1: a timedelta would overflow
            raise ValueError(f"{days} days up to {until} start before the year 1")
        since = until - timedelta(days=days - 1)
    if until < since:
        raise ValueError(f"until ({until}) is before since ({since})")
    if (until - since).days >= MAX_REPORT_DAYS:
        raise ValueError(f"a report spans at most {MAX_REPORT_DAYS} days; "
                         f"{since} to {until} is {(until - since).days + 1}")
    return since, until


def usage_report(session: Session, since: date, until: date, by: ReportBy,
                 user: UserRef | None = None, model: str | None = None) -> list[UsageReportRow]:
    """The usage of the UTC days `since` to `until` (both included), summed by user, by model
    or by day, optionally of one user or one model. By user or model: the largest (tokens)
    first; by day: every day of the range in order, a quiet day as zeros."""
    since, until = report_range(since, until)
    key = {"user": User.name, "model": Usage.model, "day": Usage.day}[by]
    stmt = (select(key, *(func.coalesce(func.sum(getattr(Usage, c)), 0) for c in COUNTERS))
            .join(User, User.id == Usage.user_id)
            .where(Usage.day >= since, Usage.day <= until)
            .group_by(key))
    if user is not None:
        stmt = stmt.where(Usage.user_id == get_user(session, user).id)
    if model is not None:
        stmt = stmt.where(Usage.model == usage_model_name(model))
    sums = {k: _counts(values) for k, *values in session.execute(stmt)}
    if by == "day":
        days = (since + timedelta(days=i) for i in range((until - since).days + 1))
        return [UsageReportRow(None, None, d, sums.get(d, UsageCounts())) for d in days]
    ordered = sorted(sums.items(), key=lambda kv: (-kv[1].total_tokens, kv[0]))
    return [UsageReportRow(k if by == "user" else None, k if by == "model" else None, None, c)
            for k, c in ordered]


def report_total(rows: list[UsageReportRow]) -> UsageCounts:
    """A report's total: its rows' counters summed (each usage row is in exactly one)."""
    return sum((r.counts for r in rows), UsageCounts())


def _counts(values: list) -> UsageCounts:
    return UsageCounts(*(float(v) if c in FLOAT_COUNTERS else int(v)
                         for c, v in zip(COUNTERS, values, strict=True)))
