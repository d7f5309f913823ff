"""SQLite engine creation: WAL, foreign keys, a busy timeout, on every connection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event

# How long a writer waits for another writer's lock before "database is locked". The batched
# writer holds the lock for milliseconds; CLI commands may run beside a live server.
BUSY_TIMEOUT_MS = 10_000

# The connection execution option that makes the next transaction BEGIN IMMEDIATE.
IMMEDIATE = "officellm_begin_immediate"


def sqlite_url(path: Path | str) -> str:
    """The SQLAlchemy URL of a database file."""
    return f"sqlite:///{Path(path).expanduser()}"


def _on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    # Take transaction control away from Python's sqlite3 (which would BEGIN only before
    # INSERT/UPDATE/DELETE, leaving DDL and reads outside any transaction) and give it to
    # SQLAlchemy, which emits BEGIN in _on_begin: migrations and batches become atomic.
    dbapi_connection.isolation_level = None
    cur = dbapi_connection.cursor()
    try:
        # WAL: readers (admin API, quota checks) never block the writer and vice versa; the
        # setting is persistent in the file, but asking again is free.
        cur.execute("PRAGMA journal_mode=WAL")
        # SQLite ships with foreign keys off, per connection.
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        # FULL: every commit is on disk before it returns. Writes are batched (one commit per
        # flush interval), so the extra fsync costs nothing noticeable and power loss cannot
        # take back a committed batch.
        cur.execute("PRAGMA synchronous=FULL")
    finally:
        cur.close()


def _on_begin(conn: Any) -> None:
    # A write transaction takes the write lock at BEGIN IMMEDIATE, waiting up to the busy
    # timeout for it. A deferred BEGIN that reads first and writes later would instead have
    # to upgrade its read snapshot; if another writer (the batched usage writer, every flush
    # interval) committed meanwhile, SQLite refuses the upgrade at once with "database is
    # locked", whatever the busy timeout (waiting could not make the stale snapshot current).
    immediate = conn.get_execution_options().get(IMMEDIATE, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def make_engine(path: Path | str, echo: bool = False) -> Engine:
    """An Engine for the SQLite file at `path` (its directory is created if missing)."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        sqlite_url(path),
        echo=echo,
        # The pool hands connections to whichever thread asks (request handlers, the writer).
        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000},
    )
    event.listen(engine, "connect", _on_connect)
    event.listen(engine, "begin", _on_begin)
    return engine
