"""Fixtures: a real database per test, migrated by the real Alembic scripts. `db` is each
of the two officellm stores its data in, a SQLite file and a PostgreSQL database (started by
the tests: the `postgres` fixture, tests/conftest.py); `sqlite_db` is for what only SQLite has (its file,
its pragmas, its WAL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from officellm.app.db.database import Database


@pytest.fixture(autouse=True)
def _data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A shared database keeps its files (admin token, JWT secrets) in the machine's data
    # directory: the tests', never the user's.
    monkeypatch.setenv("OFFICELLM_DATA_DIR", str(tmp_path / "data"))


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "officellm.db"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_target(request: pytest.FixtureRequest, db_path: Path) -> Path | str:
    """A fresh database: a SQLite file's path, or a new PostgreSQL database's URL."""
    if request.param == "sqlite":
        return db_path
    return request.getfixturevalue("postgres").url()


def _migrated(target: Path | str) -> Iterator[Database]:
    database = Database(target)
    database.upgrade()
    yield database
    database.close()


@pytest.fixture
def db(db_target: Path | str) -> Iterator[Database]:
    yield from _migrated(db_target)


@pytest.fixture
def sqlite_db(db_path: Path) -> Iterator[Database]:
    yield from _migrated(db_path)
