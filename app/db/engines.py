"""Database engines: SQLite (a file, the default) or PostgreSQL (shared by replicas), from one
URL, and how each takes the writers' lock.

SQLite serialises writers itself; a write transaction takes its lock at BEGIN IMMEDIATE. In
PostgreSQL writers run side by side, so a write transaction takes one transaction-level
advisory lock first: the same one-writer-at-a-time rule, so read-then-write code (a quota
check and its count, the first sight of a forwarded person) stays race-free on both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url, text
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session

# How long a writer waits for another writer's lock before "database is locked". The batched
# writer holds the lock for milliseconds; CLI commands may run beside a live server.
BUSY_TIMEOUT_MS = 10_000

# The connection execution option that makes the next SQLite transaction BEGIN IMMEDIATE.
IMMEDIATE = "officellm_begin_immediate"

# The advisory lock's key in PostgreSQL: writers of one officellm database take this one.
WRITERS_LOCK = 0x6F66_6C6C  # "ofll"
# Replicas starting together migrate one at a time (app/db/migrate.py).
MIGRATION_LOCK = 0x6F66_6D67  # "ofmg"

DIALECTS = ("sqlite", "postgresql")

# What a database that cannot answer raises: a PostgreSQL server down, restarting or cut off
# by the network; a SQLite file locked past the busy timeout or on a failing disk. Nothing
# was written (the transaction rolled back), so a request is refused with a 503 to retry.
UNAVAILABLE = (OperationalError, InterfaceError)
# Seconds to wait for a PostgreSQL connection: a host that is down must cost a request a
# prompt 503, not the system's TCP timeout of minutes.
CONNECT_TIMEOUT_S = 5


class UnsupportedDatabase(ValueError):
    """A database URL of a kind officellm does not store its data in."""


def database_url(target: str | Path) -> str:
    """The SQLAlchemy URL of `target`: a URL as it is, a path as its SQLite file.
    UnsupportedDatabase for a URL that is neither SQLite nor PostgreSQL."""
    if isinstance(target, Path) or "://" not in target:
        return f"sqlite:///{Path(target).expanduser()}"
    url = make_url(target)
    if url.get_backend_name() not in DIALECTS:
        raise UnsupportedDatabase(
            f"officellm stores its data in SQLite (a file) or PostgreSQL "
            f"(postgresql+psycopg://...); {url.get_backend_name()!r} is neither.")
    if url.get_backend_name() == "postgresql" and url.get_driver_name() not in ("psycopg",):
        # psycopg 3 is the driver installed with officellm[cluster]; psycopg2 is not.
        url = url.set(drivername="postgresql+psycopg")
    return url.render_as_string(hide_password=False)


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (None for another database)."""
    parsed = make_url(url)
    return Path(parsed.database or "") if parsed.get_backend_name() == "sqlite" else None


def _sqlite_on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    # Take transaction control away from Python's sqlite3 (which would BEGIN only before
    # INSERT/UPDATE/DELETE, leaving DDL and reads outside any transaction) and give it to
    # SQLAlchemy, which emits BEGIN in _sqlite_on_begin: migrations and batches become atomic.
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


def _sqlite_on_begin(conn: Any) -> None:
    # A write transaction takes the write lock at BEGIN IMMEDIATE, waiting up to the busy
    # timeout for it. A deferred BEGIN that reads first and writes later would instead have
    # to upgrade its read snapshot; if another writer (the batched usage writer, every flush
    # interval) committed meanwhile, SQLite refuses the upgrade at once with "database is
    # locked", whatever the busy timeout (waiting could not make the stale snapshot current).
    immediate = conn.get_execution_options().get(IMMEDIATE, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def make_engine(url: str, echo: bool = False) -> Engine:
    """An Engine for `url` (database_url's): a SQLite file (its directory created if missing)
    with WAL, foreign keys and a busy timeout, or a PostgreSQL pool that checks a connection
    before handing it out (a database restarted under a running server costs no request)."""
    path = sqlite_file(url)
    if path is None:
        return create_engine(url, echo=echo, pool_pre_ping=True, pool_size=5, max_overflow=10,
                             connect_args={"connect_timeout": CONNECT_TIMEOUT_S})
    path = path.expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        echo=echo,
        # The pool hands connections to whichever thread asks (request handlers, the writer).
        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000},
    )
    event.listen(engine, "connect", _sqlite_on_connect)
    event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def take_writers_lock(session: Session) -> None:
    """Start `session`'s transaction holding the writers' lock until it ends: BEGIN
    IMMEDIATE on SQLite, an advisory lock on PostgreSQL."""
    if session.get_bind().dialect.name == "sqlite":
        session.connection(execution_options={IMMEDIATE: True})  # BEGIN IMMEDIATE now
    else:
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": WRITERS_LOCK})
