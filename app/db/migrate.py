"""Alembic, driven from code: works from an installed package, no alembic.ini needed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from officellm.app.db.engines import MIGRATION_LOCK


def migrations_dir() -> Path:
    """The directory of the `migrations` package (env.py, script.py.mako, versions/).

    Found, not imported: Alembic loads env.py from it by path, and env.py imports app.db, so
    an import here would make app.db and migrations import each other."""
    spec = importlib.util.find_spec("officellm.migrations")
    assert spec is not None and spec.submodule_search_locations, "officellm.migrations is missing"
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def alembic_config(url: str | None = None) -> Config:
    """An Alembic Config pointing at the packaged migrations; `url` is used when no connection
    is passed in through `config.attributes["connection"]`."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url)
    return cfg


def head_revision() -> str:
    """The newest revision in migrations/versions/."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "migrations/versions/ is empty"
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None for an empty database)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _set_foreign_keys(conn: Connection, on: bool) -> None:
    # The pragma is a no-op inside a transaction, and SQLAlchemy would BEGIN before any
    # statement it runs, so it goes straight to the driver connection.
    conn.connection.driver_connection.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")


def _run(engine: Engine, action: str, revision: str) -> None:
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            _run_sqlite(conn, action, revision)
        else:
            _run_postgresql(conn, action, revision)


def _alembic(conn: Connection, action: str, revision: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = conn
    getattr(command, action)(cfg, revision)


def _run_sqlite(conn: Connection, action: str, revision: str) -> None:
    # Batch migrations rebuild SQLite tables (create copy, drop, rename); with foreign keys
    # on, dropping a parent table would cascade into or fail on its children.
    _set_foreign_keys(conn, False)
    try:
        _alembic(conn, action, revision)
        conn.commit()
        _check_foreign_keys(conn)
        conn.commit()
    finally:
        if conn.in_transaction():  # a failed migration: its transaction must end first
            conn.rollback()
        _set_foreign_keys(conn, True)


def _run_postgresql(conn: Connection, action: str, revision: str) -> None:
    # PostgreSQL alters tables in place, foreign keys checked all along, and its DDL is
    # transactional: the whole migration commits or none of it. Replicas starting together
    # take turns on a session lock; the next finds the schema at head and does nothing.
    conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
    conn.commit()
    try:
        _alembic(conn, action, revision)
        conn.commit()
    finally:
        if conn.in_transaction():
            conn.rollback()
        conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
        conn.commit()


def _check_foreign_keys(conn: Connection) -> None:
    bad = conn.execute(text("PRAGMA foreign_key_check")).fetchall()
    if bad:
        raise RuntimeError(f"migration left dangling foreign keys: {bad[:5]}")


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade the database behind `engine` to `revision` (default: the newest)."""
    _run(engine, "upgrade", revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Downgrade the database behind `engine` to `revision` ("base" empties it)."""
    _run(engine, "downgrade", revision)
