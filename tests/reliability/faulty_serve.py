"""`officellm serve` with two bugs injected, for the engine-fault tests (run with `python -m`).

- A prompt holding DETOKENIZER_FAULT makes its detokenizer raise, like a tokenizer bug on a
  strange byte sequence: the engine must fail that request alone.
- A prompt holding SCHEDULER_FAULT makes the scheduler raise. Nothing isolates the scheduler
  (a scheduler that failed once cannot be trusted with everyone's blocks), so this kills the
  engine loop: the server must say so (/health 503, the reason in the log), never hang, and
  the next request starts the engine again.

The engine runs in this process (`--engine-in-process`): the patches are this process's.
"""

from __future__ import annotations

import sys

from officellm.cli import main
from officellm.engine.core.scheduler import Scheduler
from officellm.engine.frontend.detokenizer import IncrementalDetokenizer

DETOKENIZER_FAULT = 778
SCHEDULER_FAULT = 779
SCHEDULER_FAULT_MESSAGE = "injected scheduler fault"


def _install() -> None:
    init, step, schedule = (IncrementalDetokenizer.__init__, IncrementalDetokenizer._step,
                            Scheduler.schedule)

    def faulty_init(self, tokenizer, prompt_token_ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        init(self, tokenizer, prompt_token_ids, *args, **kwargs)
        self.faulty = DETOKENIZER_FAULT in prompt_token_ids

    def faulty_step(self, token_id):  # type: ignore[no-untyped-def]
        if self.faulty:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected detokenizer fault")
        return step(self, token_id)

    def faulty_schedule(self):  # type: ignore[no-untyped-def]
        if any(SCHEDULER_FAULT in r.prompt_token_ids for r in self.waiting):
            raise RuntimeError(SCHEDULER_FAULT_MESSAGE)
        return schedule(self)

    IncrementalDetokenizer.__init__ = faulty_init  # type: ignore[method-assign]
    IncrementalDetokenizer._step = faulty_step  # type: ignore[method-assign]
    Scheduler.schedule = faulty_schedule  # type: ignore[method-assign]


if __name__ == "__main__":
    _install()
    # The faults are patched into this process, so the engine must run here.
    sys.argv.append("--engine-in-process")
    main()
