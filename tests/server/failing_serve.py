"""`officellm serve` with a load fault injected, for the failed-start tests (run with `python -m`).

FAILING_SERVE_FAULT in the environment picks the fault:

The engine runs in this process (`--engine-in-process`): the patches are this process's.

- `bug`: loading raises an unexpected RuntimeError (a bug, not a refusal): the log has the
  traceback, the last line the one-line reason.
- `tp-worker`: a tensor-parallel worker process dies before it joins the group. The patch is
  at module level on purpose: a spawned worker runs this module again as `__mp_main__`, so the
  worker gets it too (and the server process never calls the patched function itself).
"""

from __future__ import annotations

import os
import sys

import officellm.engine.llm_engine
import officellm.engine.worker.tp_worker
from officellm.cli import main

BUG_MESSAGE = "injected load fault"
FAULT = os.environ.get("FAILING_SERVE_FAULT", "")


def _bug(model):  # type: ignore[no-untyped-def]
    raise RuntimeError(BUG_MESSAGE)


def _worker_cannot_start(port, world_size):  # type: ignore[no-untyped-def]
    raise RuntimeError("injected: this worker cannot reach the group")


if FAULT == "bug":
    officellm.engine.llm_engine.resolve_model_dir = _bug  # type: ignore[assignment]
elif FAULT == "tp-worker":
    officellm.engine.worker.tp_worker.join_store = _worker_cannot_start  # type: ignore[assignment]

if __name__ == "__main__":
    # The fault is patched into this process, so the engine must load here.
    sys.argv.append("--engine-in-process")
    main()
