"""A real HAProxy for the tests and the benchmarks: `haproxy -db` (in the foreground) on a
configuration file; the tests that need it skip, saying so, where it is not installed."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from officellm.loadgen.local_server import port_answers


def missing() -> str | None:
    """Why HAProxy cannot be started here (None: it can)."""
    if shutil.which("haproxy") is None:
        return "HAProxy is not installed (Debian: apt-get install haproxy)"
    return None


class HAProxy:
    """HAProxy on `config`, listening on `port` (which the configuration binds)."""

    def __init__(self, config: Path, port: int) -> None:
        self.port = port
        check = subprocess.run(["haproxy", "-c", "-q", "-f", str(config)],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        self._log = open(config.with_suffix(".log"), "wb")  # noqa: SIM115 (closed in stop)
        self._proc = subprocess.Popen(["haproxy", "-db", "-f", str(config)],
                                      stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not port_answers(port):
            assert self._proc.poll() is None, config.with_suffix(".log").read_text()
            assert time.monotonic() < deadline, "haproxy did not start listening"
            time.sleep(0.05)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._log.close()
