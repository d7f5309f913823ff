"""Fixtures: a real SQLite file per test, migrated by the real Alembic scripts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from officellm.app.db.database import Database


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "officellm.db"


@pytest.fixture
def db(db_path: Path) -> Iterator[Database]:
    database = Database(db_path)
    database.upgrade()
    yield database
    database.close()

