"""Fixtures: a real SQLite file per test, migrated by the real Alembic scripts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.db.database import Database


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "officellm.db"


@pytest.fixture
def db(db_path: Path) -> Iterator[Database]:
    database = Database(db_path)
    database.upgrade()
    yield database
    database.close()


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The bundled SmolLM2 tokenizer (the real chat template the engine uses)."""
    from transformers import AutoTokenizer

    from engine.loading.model_loader import resolve_model_dir

    return AutoTokenizer.from_pretrained(str(resolve_model_dir(None)))
