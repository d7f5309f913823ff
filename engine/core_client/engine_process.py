"""The engine process: one model's engine core, started by the server
(`python -m officellm.engine.core_client.engine_process FD PARENT_PID NICENESS`), spoken to over the
socket FD (wire.py; process_client.py is the server's side). It loads the model, says Ready
(or why not), then runs steps until told to stop, the server goes, or it dies.

It dies with the server (child_side.die_with_parent). Its imports and its load run
behind the models already serving (child_side.load_behind_the_others), so this module
imports nothing heavy itself: served_core.py is imported on the load's thread.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from officellm.engine.core_client.child_side import die_with_parent, load_behind_the_others

if TYPE_CHECKING:
    from officellm.engine.core_client.served_core import ServedCore


def _load(fd: int) -> ServedCore | None:
    # Imported here, on the low-priority load thread: torch and the model code are seconds
    # of CPU that must not take cores from the models serving beside this one.
    from officellm.engine.core_client.served_core import ServedCore

    return ServedCore.load(fd)


def main(argv: list[str]) -> int:
    fd, parent_pid, niceness = int(argv[0]), int(argv[1]), int(argv[2])
    die_with_parent(parent_pid)
    served = load_behind_the_others(lambda: _load(fd), niceness)
    return 1 if served is None else served.serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
