"""Fixtures: a real database per test, migrated by the real Alembic scripts. `db` is each
of the two officellm stores its data in, a SQLite file and a PostgreSQL database (started by
the tests: tests/support/postgres.py); `sqlite_db` is for what only SQLite has (its file,
its pragmas, its WAL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from officellm.app.db.database import Database
from tests.support.postgres import PostgresServer, missing


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    reason = missing()
    if reason is not None:
        pytest.skip(f"PostgreSQL tests skipped: {reason}")
    server = PostgresServer()
    yield server
    server.stop()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "officellm.db"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_target(request: pytest.FixtureRequest, db_path: Path) -> Path | str:
    """A fresh database: a SQLite file's path, or a new PostgreSQL database's URL."""
    if request.param == "sqlite":
        return db_path
    return request.getfixturevalue("postgres").url()


def _migrated(target: Path | str, files_dir: Path) -> Iterator[Database]:
    database = Database(target, files_dir=files_dir)
    database.upgrade()
    yield database
    database.close()


@pytest.fixture
def db(db_target: Path | str, tmp_path: Path) -> Iterator[Database]:
    yield from _migrated(db_target, tmp_path)


@pytest.fixture
def sqlite_db(db_path: Path) -> Iterator[Database]:
    yield from _migrated(db_path, db_path.parent)
