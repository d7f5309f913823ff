"""What the reliability tests read off a running server: the engine's live counters (through
the admin API), the process's resident memory, and the ERROR lines of its log."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.policy.helpers import Admin
from tests.support.server_process import ServerProcess


def admin_for(server: ServerProcess) -> Admin:
    """The admin API of `server` (the token file lies beside its database)."""
    return Admin(server.base_url, Path(server.db_path))


def wait_idle(server: ServerProcess, timeout: float = 60.0) -> dict[str, Any]:
    """Poll /admin/stats until nothing runs or waits; return the engine's stats then."""
    admin = admin_for(server)
    deadline = time.monotonic() + timeout
    while True:
        engine = admin.get("/stats")["engine"]
        if engine["num_running"] == 0 and engine["num_waiting"] == 0:
            return engine
        if time.monotonic() > deadline:
            raise AssertionError(f"the engine is still busy after {timeout} s: {engine}")
        time.sleep(0.1)


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` now (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def error_lines(log: str) -> list[str]:
    """The log's ERROR and CRITICAL records (format: `time LEVEL logger: message`)."""
    return [line for line in log.splitlines() if " ERROR " in line or " CRITICAL " in line]
