"""The embedding process: one embedding model, started by the server
(`python -m officellm.engine.embedding.encoder_process FD PARENT_PID NICENESS`; process_encoder.py is
the server's side, served_encoder.py what it runs). Its imports and its load run behind the
models already serving (core_client/child_side.load_behind_the_others)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from officellm.engine.core_client.child_side import die_with_parent, load_behind_the_others

if TYPE_CHECKING:
    from officellm.engine.embedding.served_encoder import ServedEncoder


def _load(fd: int) -> ServedEncoder | None:
    # Imported here, on the low-priority load thread: torch and the model are seconds of
    # CPU that must not take cores from the models serving beside this one.
    from officellm.engine.embedding.served_encoder import ServedEncoder

    return ServedEncoder.load(fd)


def main(argv: list[str]) -> int:
    fd, parent_pid, niceness = int(argv[0]), int(argv[1]), int(argv[2])
    die_with_parent(parent_pid)
    served = load_behind_the_others(lambda: _load(fd), niceness)
    return 1 if served is None else served.serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
