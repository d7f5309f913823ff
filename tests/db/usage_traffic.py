"""Helper process for the SIGKILL test: counts fake requests through a UsageWriter forever.

Each iteration counts one request of 10 prompt + 5 completion tokens, one event, one thread
update and one key use for user 1 (key 1), flushing every 5 ms, until killed.
"""

from __future__ import annotations

import sys

from officellm.app.accounts.usage_writer import UsageWriter
from officellm.app.db.database import Database


def main(path: str) -> None:
    db = Database(path)
    writer = UsageWriter(db, interval=0.005)
    i = 0
    while True:
        i += 1
        writer.add_usage(1, prompt_tokens=10, completion_tokens=5)
        writer.record_event("traffic", 1, {"i": i})
        writer.record_thread(1, "h:traffic", turns=i, prompt_tokens=10 * i, completion_tokens=5)
        writer.touch_key(1)
        if i == 1:
            print("started", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
