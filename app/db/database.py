"""`Database`: one SQLite file, its engine, its sessions, its schema version."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from officellm.app.db import migrate
from officellm.app.db.jwt_secrets import JwtSecretStore
from officellm.app.db.paths import admin_token_path, default_db_path, jwt_secrets_dir
from officellm.app.db.sqlite_engine import IMMEDIATE, make_engine


class Database:
    """Owns the engine and session factory of one database file.

    Thread-safe: each caller takes its own session (`with db.session() as s:` for reads,
    `with db.transaction() as s:` for writes that commit on success).
    """

    def __init__(self, path: Path | str | None = None, echo: bool = False) -> None:
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        self.engine = make_engine(self.path, echo=echo)
        # expire_on_commit=False: objects handed back by the repository functions stay
        # readable after their transaction ends.
        self.sessionmaker = sessionmaker(self.engine, expire_on_commit=False)
        self.jwt_secrets = JwtSecretStore(jwt_secrets_dir(self.path))

    @property
    def admin_token_path(self) -> Path:
        """Where the raw admin token is written at first start (beside the database)."""
        return admin_token_path(self.path)

    def session(self) -> Session:
        """A new session; use as a context manager. Nothing is committed unless you commit."""
        return self.sessionmaker()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session inside one write transaction: committed on success, rolled back on error.

        It holds SQLite's write lock from its start (BEGIN IMMEDIATE, waiting out another
        writer up to the busy timeout), so reading then writing inside it never fails with
        "database is locked" because another writer committed in between.
        """
        with self.sessionmaker() as session, session.begin():
            session.connection(execution_options={IMMEDIATE: True})  # BEGIN IMMEDIATE now
            yield session

    def upgrade(self, revision: str = "head") -> None:
        """Bring the schema to `revision` (default: the newest). Safe to call every start."""
        migrate.upgrade(self.engine, revision)

    def downgrade(self, revision: str) -> None:
        """Take the schema back to `revision` ("base" drops every table)."""
        migrate.downgrade(self.engine, revision)

    def current_revision(self) -> str | None:
        """The schema revision of the file (None when it has never been migrated)."""
        return migrate.current_revision(self.engine)

    def is_at_head(self) -> bool:
        """True when the schema is the newest this code knows."""
        return self.current_revision() == migrate.head_revision()

    def checkpoint(self) -> None:
        """Copy the WAL into the main file and truncate it (for backups and byte-level tests)."""
        with self.engine.connect() as conn:
            conn.connection.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def integrity_check(self) -> str:
        """SQLite's `PRAGMA integrity_check` result ("ok" when the file is sound)."""
        with self.engine.connect() as conn:
            rows = conn.execute(text("PRAGMA integrity_check")).scalars().all()
        return "\n".join(rows)

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()
