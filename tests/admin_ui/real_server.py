"""A real `python -m app.cli serve` on a free port for the console's acceptance tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from loadgen.server_wait import wait_until_healthy

REPO = Path(__file__).resolve().parents[2]
# SmolLM2-135M in float32 is 46,080 B/token: 16 MiB is 22 blocks of 16 = 352 tokens, so a few
# concurrent 250-token requests run out of blocks and the scheduler must preempt.
SMALL_POOL_FLAGS = ["--dtype", "float32", "--kv-cache-memory", "16MiB", "--max-model-len", "256"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def server_env(data_dir: Path) -> dict[str, str]:
    """The environment a test server (or a console-started one) runs in."""
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                OFFICELLM_DATA_DIR=str(data_dir), TOKENIZERS_PARALLELISM="false",
                OMP_NUM_THREADS="1")  # two shared cores: one compute thread per server


def wait_health(base_url: str, proc: subprocess.Popen | None = None, log: Path | None = None,
                timeout: float = 180.0) -> None:
    wait_until_healthy(base_url, proc=proc, timeout=timeout,
                       describe=lambda: log.read_text() if log else "")


class RealServer:
    def __init__(self, data_dir: Path, *flags: str) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = data_dir / f"serve-{self.port}.log"
        args = [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port), *flags]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, cwd=REPO, env=server_env(data_dir), stdout=log,
                                         stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        wait_health(self.base_url, self.proc, self.log_path)

    @property
    def admin_token(self) -> str | None:
        path = self.data_dir / "admin_token"
        return path.read_text().strip() if path.exists() else None

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
