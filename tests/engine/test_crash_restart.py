"""A core that stops untold (its process killed) restarts on the next wake: at once the first
time, then only after a back-off while it keeps crashing, a crash in its load included
(engine/model_lifecycle.py)."""

from __future__ import annotations

import asyncio
import threading
import time

from officellm.engine import EngineState, ModelLifecycle

CAUSE = "the engine process of `m` (pid 1) was killed by SIGKILL"


class Crashing(ModelLifecycle):
    """Serves until `kill()`; its loads fail while `loads_fail`."""

    def __init__(self) -> None:
        super().__init__(None)
        self.loads = 0
        self.loads_fail = False
        self._kill = threading.Event()

    def _load(self) -> None:
        self.loads += 1
        if self.loads_fail:
            raise RuntimeError("killed while loading")

    def _serve(self) -> None:
        self._kill.wait()
        self._kill.clear()
        self.crashed(CAUSE)

    def _free(self) -> None:
        pass

    def _after_stop(self) -> None:
        pass

    def kill(self) -> None:
        self._kill.set()
        deadline = time.monotonic() + 5
        while self.state is not EngineState.DEAD:
            assert time.monotonic() < deadline
            time.sleep(0.01)


def started() -> Crashing:
    core = Crashing()
    core._start_thread()
    assert core.wait_ready(5)
    return core


def test_the_first_crash_restarts_on_the_next_wake() -> None:
    core = started()
    core.kill()
    assert core.restartable and CAUSE in core.unavailable_reason()
    assert asyncio.run(core.wake()) and core.is_ready and core.loads == 2


def test_a_second_crash_waits_its_back_off_without_loading() -> None:
    core = started()
    core.kill()
    assert asyncio.run(core.wake())
    core.kill()
    assert core.restart_in() > 0
    assert not asyncio.run(core.wake())
    assert core.loads == 2 and "starts again on a request after" in core.unavailable_reason()


def test_a_restart_whose_load_fails_counts_as_a_crash() -> None:
    core = started()
    core.kill()
    core.loads_fail = True
    assert not asyncio.run(core.wake())
    assert core.state is EngineState.DEAD and core.restartable
    assert core.restart_in() > 0
