"""Start `officellm serve` as a real subprocess on a free port, for the acceptance tests."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from loadgen.local_server import free_port, stop_process
from loadgen.server_wait import wait_until_healthy

REPO = Path(__file__).resolve().parents[2]
API_KEY = "sk-officellm-test"
# Small pool and float32, for exact parity with engine.LLM.
TEST_THREADS = "1"
BASE_FLAGS = ["--dtype", "float32", "--kv-cache-memory", "256MiB"]


class ServerProcess:
    """A running `python -m app.cli serve` with its log captured to a file.

    `db`: the database file (default: a fresh one in a temporary directory, removed by stop()),
    so tests never touch the user's own data directory. `module`: what `python -m` runs (a
    test launcher that injects a fault, then calls app.cli.main).
    """

    def __init__(self, *flags: str, api_key: str | None = API_KEY, db: Path | None = None,
                 env: dict[str, str] | None = None, module: str = "app.cli") -> None:
        self.port = free_port()
        self.api_key = api_key
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="officellm-serve-", suffix=".log",
                                               delete=False)
        self._tmp_dir = None if db is not None else tempfile.mkdtemp(prefix="officellm-db-")
        self.db_path = db if db is not None else Path(self._tmp_dir) / "officellm.db"
        args = [sys.executable, "-m", module, "serve", "--port", str(self.port), *BASE_FLAGS,
                "--db", str(self.db_path), *flags]
        if api_key:
            args += ["--api-key", api_key]
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   TOKENIZERS_PARALLELISM="false", **(env or {}))
        # One compute thread: CI boxes are small and shared, and two OpenMP threads on two
        # contended cores made each step several times slower. Same as reference_llm's.
        env.setdefault("OMP_NUM_THREADS", TEST_THREADS)
        self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)

    def __enter__(self) -> ServerProcess:
        """Ready to answer (stopped again, log and database removed, on exit)."""
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Poll /health until 200; fail with the server's log if it dies or never gets ready."""
        wait_until_healthy(self.base_url, proc=self.proc, describe=self.output, timeout=timeout,
                           interval=0.2)

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: no drain, no final flush (the crash case)."""
        self.proc.kill()
        self.proc.wait()

    def stop(self, keep_db: bool = False) -> None:
        stop_process(self.proc)
        self.log.close()
        os.unlink(self.log.name)
        if self._tmp_dir is not None and not keep_db:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
