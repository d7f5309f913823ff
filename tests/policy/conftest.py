"""One real `officellm serve` (bundled SmolLM2, its own SQLite file) shared by the policy
tests, reached with the real `openai` client; users and keys are made through the admin API."""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from officellm.app.db import Database
from tests.policy.helpers import Admin, Office
from tests.support.server_process import ServerProcess

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

OLD_USER = "olga"  # written at schema 0001 by "an older officellm", before the first start


def make_db_at_0001(path: Path) -> None:
    """A database at the first revision with a user, a key hash and an override in it."""
    db = Database(path)
    db.upgrade("0001_initial")
    db.close()
    con = sqlite3.connect(path)
    con.executescript(f"""
        INSERT INTO users (id, name, disabled, created)
            VALUES (7, '{OLD_USER}', 0, '2025-01-11 09:00:00.000000');
        INSERT INTO policies (user_id, max_turns, on_limit)
            VALUES (7, 40, 'notify');
    """)
    con.commit()
    con.close()


@pytest.fixture(scope="session")
def office(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Office]:
    """The server, started on a database created at revision 0001 (acceptance 4)."""
    db_path = tmp_path_factory.mktemp("office") / "officellm.db"
    make_db_at_0001(db_path)
    srv = ServerProcess("--max-num-seqs", "8", api_key=None, db=db_path)
    try:
        srv.wait_ready()
        yield Office(srv, Admin(srv.base_url, db_path))
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def tokenizer(smollm2_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.fixture
def uniq() -> str:
    """A fresh suffix for user names, so tests sharing the server never collide."""
    return uuid.uuid4().hex[:8]
