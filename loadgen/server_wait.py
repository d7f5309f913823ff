"""Wait for an HTTP server (officellm or llama-server) to answer GET /health with 200."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import httpx


def wait_until_healthy(base_url: str, *, proc: subprocess.Popen | None = None,
                       describe: Callable[[], str] = lambda: "", timeout: float = 180.0,
                       interval: float = 0.25, name: str = "server") -> None:
    """Poll `base_url`/health until it answers 200.

    Raises RuntimeError as soon as `proc` has exited, and TimeoutError after `timeout`
    seconds; both messages end with `describe()` (typically the server's log).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{describe()}")
        try:
            if httpx.get(f"{base_url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(interval)
    raise TimeoutError(f"{name} not ready in {timeout} s:\n{describe()}")
