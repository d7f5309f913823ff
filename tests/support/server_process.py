"""The tests' one way to run `officellm serve` as a real subprocess on a free port.

Built on loadgen.local_server.Server (the benchmarks' helper: launch, wait for /health,
SIGTERM then SIGKILL); this adds what the tests need: a fresh database (or a data dir, the way
the console's own server runs), one compute thread, a test API key, and cleaning up after.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from officellm.app.db.paths import DB_FILENAME, admin_token_path
from officellm.loadgen.local_server import Server, free_port, port_answers

REPO = Path(__file__).resolve().parents[2]
API_KEY = "sk-officellm-test"
# Small pool, float32 and dense weights, for exact parity with engine.LLM.
TEST_THREADS = "1"
BASE_FLAGS = ["--dtype", "float32", "--quantization", "none", "--kv-cache-dtype", "float32",
              "--kv-cache-memory", "256MiB"]
# The console's tests: SmolLM2-135M in float32 is 46,080 B/token, so 16 MiB is 22 blocks of 16
# = 352 tokens; a few concurrent 250-token requests run out of blocks and the scheduler must
# preempt.
SMALL_POOL_FLAGS = ["--dtype", "float32", "--quantization", "none", "--kv-cache-dtype", "float32",
                    "--kv-cache-memory", "16MiB", "--max-model-len", "256"]
# Servers run each engine in the server's process (`--engine-in-process`) unless a test is
# about the engine processes (ServerProcess(engine_processes=True)) or this is set: a process
# per engine costs an interpreter's start and torch's import per load and wake, which the CI
# budget cannot pay for every server of the suite (docs/testing.md).
ENGINE_PROCESSES_ENV = "OFFICELLM_TEST_ENGINE_PROCESSES"

__all__ = ["API_KEY", "BASE_FLAGS", "ENGINE_PROCESSES_ENV", "REPO", "SMALL_POOL_FLAGS", "TEST_THREADS", "ServerProcess",
           "free_port", "port_answers"]


class ServerProcess:
    """A running `python -m officellm.cli serve` with its log captured to a file.

    `db`: the database file. `data_dir`: run with OFFICELLM_DATA_DIR there (the database and
    admin token in it unless `db` says otherwise), as the console's local server does. With
    neither, a fresh database in a temporary directory, removed by stop(): tests never touch
    the user's own data directory. `env`: extra environment. `module`: what `python -m` runs
    (a test launcher that injects a fault, then calls cli.main). `database_url`: a shared
    database (PostgreSQL) instead of the file, the replica's own files in its temporary data
    directory. `engine_processes`: each engine in a process of its own, as `officellm serve`
    runs them; by default only with ENGINE_PROCESSES_ENV set.
    """

    def __init__(self, *flags: str, api_key: str | None = API_KEY, db: Path | None = None,
                 data_dir: Path | None = None, env: dict[str, str] | None = None,
                 module: str = "officellm.cli", database_url: str | None = None,
                 engine_processes: bool | None = None) -> None:
        self.api_key = api_key
        self.data_dir = data_dir
        self.database_url = database_url
        self._tmp_dir = (tempfile.mkdtemp(prefix="officellm-db-")
                         if db is None and data_dir is None else None)
        if db is not None:
            self.db_path = Path(db)
        elif data_dir is not None:
            self.db_path = Path(data_dir) / DB_FILENAME  # the server's default there
        else:
            self.db_path = Path(self._tmp_dir) / DB_FILENAME
        port = free_port()
        args = [sys.executable, "-m", module, "serve", "--port", str(port), *BASE_FLAGS]
        if database_url is not None:
            # A shared database: this replica's own files (admin token) in its data directory.
            args += ["--database-url", database_url]
            if data_dir is None:
                data_dir = self.data_dir = self.db_path.parent
        elif data_dir is None or db is not None:
            args += ["--db", str(self.db_path)]
        args += flags
        if engine_processes is None:
            engine_processes = os.environ.get(ENGINE_PROCESSES_ENV, "") not in ("", "0")
        if not engine_processes and "--engine-in-process" not in args:
            args += ["--engine-in-process"]
        if api_key:
            args += ["--api-key", api_key]
        full_env = dict(os.environ,
                        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                        TOKENIZERS_PARALLELISM="false", **(env or {}))
        if data_dir is not None:
            full_env["OFFICELLM_DATA_DIR"] = str(data_dir)
        # One compute thread: CI boxes are small and shared, and two OpenMP threads on two
        # contended cores made each step several times slower. Same as reference_llm's.
        full_env.setdefault("OMP_NUM_THREADS", TEST_THREADS)
        self.server = Server("officellm-serve", args, full_env, port, cwd=REPO)
        self.server.launch()

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
    def port(self) -> int:
        return self.server.port

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def proc(self) -> subprocess.Popen:
        assert self.server.proc is not None
        return self.server.proc

    @property
    def log(self):
        """The log file (its .name is the path)."""
        return self.server.log

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def admin_token(self) -> str | None:
        """The admin token the server wrote beside its database (None before it has)."""
        path = admin_token_path(self.db_path.parent)
        return path.read_text().strip() if path.exists() else None

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Poll /health until 200; fail with the server's log if it dies or never gets ready."""
        self.server.wait_ready(timeout=timeout, interval=0.2, describe=self.output)

    def output(self) -> str:
        return self.server.output()

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: no drain, no final flush (the crash case)."""
        self.proc.kill()
        self.proc.wait()

    def stop(self, keep_db: bool = False) -> None:
        """Stop the server (SIGTERM, then SIGKILL), delete its log and, unless `keep_db`, the
        temporary database directory."""
        self.server.stop()
        self.server.remove_log()
        if self._tmp_dir is not None and not keep_db:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
