"""The audit log: one row per admin change, added in the same transaction as the change, so
the two commit together or neither does (docs/security.md "The audit log").

Append-only from the server's side: this module adds rows and reads them, and nothing else
in officellm writes the table (tests/db/test_audit_log.py checks that no other module names
it). What a row holds is never a secret: record_change drops the fields that could carry
one (SECRET_FIELDS) wherever they appear in `before` or `after`, and no caller passes
message content.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from officellm.app.db.column_types import utcnow
from officellm.app.db.records import AuditEntry
from officellm.app.db.tables import AuditEntryRow

# Field names whose values could be a key, token, password or hash: never stored.
SECRET_FIELDS = frozenset({
    "raw", "key", "key_hash", "token", "password", "secret", "jwt_secret_hash",
    "jwt_secret_sealed", "admin_token_hash",
})
# The actor of a change made with the admin token by a client that did not say who it is.
ADMIN_TOKEN_ACTOR = "admin-token"
# The longest actor, action and target the table holds (longer ones are cut).
ACTOR_MAX, ACTION_MAX, TARGET_MAX = 128, 64, 256


def without_secrets(value: Any) -> Any:
    """`value` with every SECRET_FIELDS entry removed from its mappings, at any depth."""
    if isinstance(value, Mapping):
        return {k: without_secrets(v) for k, v in value.items() if k not in SECRET_FIELDS}
    if isinstance(value, (list, tuple)):
        return [without_secrets(v) for v in value]
    return value


def record_change(session: Session, actor: str, action: str, target: str,
                  before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> None:
    """Add one audit row: `actor` ("admin-token", "console:alice", "cli:alice") did `action`
    ("user.create", "policy.set", ...) to `target` (a user's, model's or key's name or id);
    `before`/`after` are JSON-able values of what changed (None where it did not exist).
    Call it inside the change's own transaction."""
    session.add(AuditEntryRow(
        time=utcnow(), actor=actor[:ACTOR_MAX], action=action[:ACTION_MAX],
        target=target[:TARGET_MAX], before=without_secrets(before),
        after=without_secrets(after)))
    session.flush()


@dataclass(frozen=True)
class AuditQuery:
    """Which rows to read: a time range, one actor, one action; newest first, at most
    `limit`. An actor without a colon also matches its kind: "cli" finds "cli:alice"."""

    since: datetime | None = None
    until: datetime | None = None
    actor: str | None = None
    action: str | None = None
    limit: int = 100


def _utc(value: datetime) -> datetime:
    """`value` in UTC (naive: UTC already); a time whose zone puts it before year 1 or after
    9999 in UTC becomes the first or last time there is (found by fuzzing: an OverflowError)."""
    if value.tzinfo is None:
        return value
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:
        return datetime.min if value.year == datetime.min.year else datetime.max


def audit_entries(session: Session, query: AuditQuery) -> list[AuditEntry]:
    """The rows `query` asks for, newest first."""
    row = AuditEntryRow
    stmt = select(row).order_by(row.time.desc(), row.id.desc()).limit(query.limit)
    if query.since is not None:
        stmt = stmt.where(row.time >= _utc(query.since))
    if query.until is not None:
        stmt = stmt.where(row.time < _utc(query.until))
    if query.actor is not None:
        stmt = stmt.where(or_(row.actor == query.actor,
                              row.actor.startswith(query.actor + ":", autoescape=True)))
    if query.action is not None:
        stmt = stmt.where(row.action == query.action)
    return [AuditEntry(id=r.id, time=r.time, actor=r.actor, action=r.action, target=r.target,
                       before=r.before, after=r.after) for r in session.scalars(stmt)]
