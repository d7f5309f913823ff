"""Writers racing on one database from separate processes, as two replicas (or a server and
the CLI) do: every update counts, and one person seen twice at once is one user. On SQLite
the file's write lock serialises them; on PostgreSQL the writers' advisory lock
(app/db/engines.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import select

from officellm.app.db.database import Database
from officellm.app.db.keys import issue_key
from officellm.app.db.tables import User
from officellm.app.db.usage import usage_today
from officellm.app.db.users import create_user

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("race_worker.py")
UPDATES = 1_000


def _race(db: Database, tmp_path: Path, *args: str) -> list[str]:
    """Two workers doing the same thing, started together; what each printed last."""
    go = tmp_path / "go"
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, str(WORKER), db.url, str(go),
                               *args], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        go.touch()
        outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    return outs


def test_two_processes_updating_one_usage_row_count_every_update(db: Database,
                                                                 tmp_path: Path) -> None:
    with db.transaction() as s:
        alice = create_user(s, "alice")
    assert alice.id == 1
    _race(db, tmp_path, "usage", str(UPDATES))
    with db.session() as s:
        day = usage_today(s, alice.id)
    assert (day.requests, day.prompt_tokens, day.completion_tokens) == (
        2 * UPDATES, 6 * UPDATES, 4 * UPDATES)


def test_one_person_first_seen_by_two_processes_at_once_is_one_user(db: Database,
                                                                    tmp_path: Path) -> None:
    with db.transaction() as s:
        create_user(s, "open-webui")
        front_end = issue_key(s, "open-webui", forwarded_users=True)
    ids = _race(db, tmp_path, "person", str(front_end.info.user_id))
    assert ids[0] == ids[1]
    with db.session() as s:
        people = s.scalars(select(User.name).where(User.via_user_id.is_not(None))).all()
    assert people == ["alice@example.com"]
