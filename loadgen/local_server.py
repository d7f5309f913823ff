"""A server process started on this machine (officellm or llama-server), with its log captured
to a file: the benchmarks' and the tests' one way to start, wait for and stop one (the tests'
tests/support/server_process.py builds on it)."""

from __future__ import annotations

import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from officellm.loadgen.server_wait import wait_until_healthy


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_answers(port: int) -> bool:
    """Something accepts connections on 127.0.0.1:`port`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def stop_process(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGTERM (the server drains and exits 0), then SIGKILL if it has not exited in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Server:
    """`args` run in `cwd` with `env`, answering on `port`. start() = launch() + wait_ready();
    the log is a temporary file (`log`), kept after stop() until remove_log()."""

    name: str
    args: list[str]
    env: dict[str, str]
    port: int
    cwd: Path | None = None
    proc: subprocess.Popen | None = None
    log: Any = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> None:
        """Start the process, output to a new log file; does not wait for it."""
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"{self.name}-", suffix=".log",
                                               delete=False)
        self.proc = subprocess.Popen(self.args, cwd=self.cwd, env=self.env, stdout=self.log,
                                     stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 300.0, interval: float = 0.5,
                   describe: Callable[[], str] | None = None) -> None:
        """Poll /health until 200; RuntimeError if the process exits first, TimeoutError after
        `timeout` s, either ending with `describe()` (default: the log's tail)."""
        wait_until_healthy(self.base_url, proc=self.proc, timeout=timeout, interval=interval,
                           name=self.name, describe=describe or self._why_not_ready)

    def start(self, timeout: float = 300.0) -> None:
        self.launch()
        self.wait_ready(timeout)

    def _why_not_ready(self) -> str:
        return (f"(-4 or 132: illegal instruction, a binary built for another CPU); "
                f"log {self.log.name}:\n{self.tail()}")

    def output(self) -> str:
        """The whole log so far."""
        self.log.flush()
        return Path(self.log.name).read_text()

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def stop(self, timeout: float = 60.0) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout)

    def remove_log(self) -> None:
        if self.log is not None:
            self.log.close()
            Path(self.log.name).unlink(missing_ok=True)
