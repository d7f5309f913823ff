"""`Database`: one database (a SQLite file or a PostgreSQL database), its engine, its
sessions, its schema version."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import make_url, text
from sqlalchemy.orm import Session, sessionmaker

from officellm.app.db import migrate
from officellm.app.db.engines import database_url, make_engine, sqlite_file, take_writers_lock
from officellm.app.db.jwt_secrets import JwtSecretStore
from officellm.app.db.paths import admin_token_path, default_db_path
from officellm.installer.paths import default_data_dir


class Database:
    """Owns the engine and session factory of one database: a SQLite file (the default) or a
    PostgreSQL database that several replicas share (app/db/engines.py).

    Thread-safe: each caller takes its own session (`with db.session() as s:` for reads,
    `with db.transaction() as s:` for writes that commit on success).
    """

    def __init__(self, target: str | Path | None = None, echo: bool = False) -> None:
        """`target`: a SQLAlchemy URL or a SQLite file's path (None: the default file)."""
        self.url = database_url(target if target is not None else default_db_path())
        self.path = sqlite_file(self.url)  # None for PostgreSQL
        # Where the admin token and the install key are kept: beside a SQLite
        # file, so a `--db` elsewhere gets its own; for a shared database, in this machine's
        # data directory.
        self.files_dir = self.path.parent if self.path is not None else default_data_dir()
        self.engine = make_engine(self.url, echo=echo)
        # expire_on_commit=False: objects handed back by the repository functions stay
        # readable after their transaction ends.
        self.sessionmaker = sessionmaker(self.engine, expire_on_commit=False)
        self.jwt_secrets = JwtSecretStore(self.files_dir)

    @property
    def is_sqlite(self) -> bool:
        return self.path is not None

    @property
    def name(self) -> str:
        """The database as logs and the CLI name it: its file, or its URL without password."""
        if self.path is not None:
            return str(self.path)
        return make_url(self.url).render_as_string(hide_password=True)

    @property
    def admin_token_path(self) -> Path:
        """Where the raw admin token is written at first start."""
        return admin_token_path(self.files_dir)

    def kv_disk_key(self) -> bytes:
        """The KV disk tier's secret: derived from this machine's install key, so the
        tier's files are unreadable without the key file (docs/security.md)."""
        return self.jwt_secrets.install_key.derive("kv disk tier")

    def session(self) -> Session:
        """A new session; use as a context manager. Nothing is committed unless you commit."""
        return self.sessionmaker()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session inside one write transaction: committed on success, rolled back on error.

        It holds the writers' lock from its start (app/db/engines.py: SQLite's BEGIN
        IMMEDIATE, waiting out another writer up to the busy timeout; PostgreSQL's advisory
        lock), so reading then writing inside it sees no other writer's commit in between.
        """
        with self.sessionmaker() as session, session.begin():
            take_writers_lock(session)
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
        """Copy the WAL into the main file and truncate it (for backups and byte-level tests);
        SQLite only."""
        assert self.is_sqlite, "checkpoint is SQLite's"
        with self.engine.connect() as conn:
            conn.connection.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def integrity_check(self) -> str:
        """SQLite's `PRAGMA integrity_check` result ("ok" when the file is sound); SQLite
        only."""
        assert self.is_sqlite, "integrity_check is SQLite's"
        with self.engine.connect() as conn:
            rows = conn.execute(text("PRAGMA integrity_check")).scalars().all()
        return "\n".join(rows)

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()
