"""The child's half of a model's process of its own (child_process.py is the server's): it
dies with the server, and it loads behind the models already serving. Imported before
anything else in the child, at full priority, so it imports only what these two need."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """In the child: be killed when the server's starting thread ends (Linux), exit now if
    it has; leave SIGINT and SIGTERM to the server (it drains, then stops its children)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # it ended before the line above
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


T = TypeVar("T")


def load_behind_the_others(load: Callable[[], T], niceness: int) -> T:
    """In the child: run `load` on a thread of its own, `niceness` lower in CPU priority
    (the server's LOAD_NICENESS when other models serve beside it, else 0), and return what
    it returned. A load is seconds of CPU work (imports, conversion, packing); beside a
    running model on a few cores, at the same priority it takes cores from that model's
    step mid-barrier and its streams stall for a second at a time. Niceness is per thread on Linux (inherited by the threads a thread starts, the
    load's OpenMP workers too, and by nothing else), so the process serves from its main
    thread at the priority it started with."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        if niceness:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                               min(19, os.getpriority(os.PRIO_PROCESS, 0) + niceness))
            except (AttributeError, OSError):  # not Linux: the load runs at the usual priority
                pass
        try:
            result.append(load())
        except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name="engine-load")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
