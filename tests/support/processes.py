"""Waiting for processes to be gone (a zombie nobody reaped yet counts as gone)."""

from __future__ import annotations

import time

import psutil


def gone(pid: int) -> bool:
    """Exited (a zombie that no one has reaped yet counts as exited)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(gone(p) for p in pids):
            return True
        time.sleep(0.1)
    return False
