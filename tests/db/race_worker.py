"""Helper process for tests/db/test_db_races.py: one of two writers racing on one database.

`python race_worker.py TARGET GO_FILE usage N`: N usage updates of user 1's day,
each its own write transaction. `... person FRONT_END_ID`: the first sight of one front-end
person (forwarded id "owui-7"). Each waits for GO_FILE so that both start together, then
prints what it did.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from officellm.app.db.database import Database
from officellm.app.db.forwarded_users import add_forwarded_user, forwarded_id_digest
from officellm.app.db.records import UsageCounts
from officellm.app.db.usage import add_usage, utc_today


def main(target: str, go_file: str, action: str, arg: str) -> None:
    db = Database(target)
    print("ready", flush=True)
    while not Path(go_file).exists():
        time.sleep(0.001)
    if action == "usage":
        for _ in range(int(arg)):
            with db.transaction() as s:
                add_usage(s, 1, utc_today(), "smollm2",
                          UsageCounts(requests=1, prompt_tokens=3, completion_tokens=2))
        print("done", flush=True)
    else:
        with db.transaction() as s:
            user = add_forwarded_user(s, int(arg), forwarded_id_digest("owui-7"),
                                      ("alice@example.com",))
        print(user.id, flush=True)
    db.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
