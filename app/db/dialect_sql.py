"""The SQL that SQLite and PostgreSQL write differently, for the session's own database: an
insert that updates on conflict, and the smaller or larger of two values."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement


def _is_sqlite(session: Session) -> bool:
    return session.get_bind().dialect.name == "sqlite"


def upsert(session: Session, table: Any) -> sqlite.Insert | postgresql.Insert:
    """An INSERT into `table` with `on_conflict_do_update` and `excluded`, in the session's
    dialect (both spell them alike)."""
    return sqlite.insert(table) if _is_sqlite(session) else postgresql.insert(table)


def least(session: Session, a: Any, b: Any) -> ColumnElement[Any]:
    """The smaller of two values: SQLite's two-argument min(), PostgreSQL's least()."""
    return func.min(a, b) if _is_sqlite(session) else func.least(a, b)


def greatest(session: Session, a: Any, b: Any) -> ColumnElement[Any]:
    """The larger of two values: SQLite's two-argument max(), PostgreSQL's greatest()."""
    return func.max(a, b) if _is_sqlite(session) else func.greatest(a, b)
