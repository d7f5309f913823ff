"""A real PostgreSQL for the tests and the benchmarks: `initdb` in a temporary directory,
`postgres` on a free loopback port, a fresh database per `url()`; thrown away at `stop()`.

PostgreSQL refuses to run as root; run as root (a CI container), the server runs as the
`postgres` user that Debian's package creates (setpriv, util-linux). Where PostgreSQL or psycopg is missing, the
tests that need it skip, saying which and how to install it.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from officellm.loadgen.local_server import free_port

# Speed over durability: the data is thrown away after the tests.
FAST = ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
USER = "officellm"


def _bin_dir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(versions[-1]).parent if versions else None


def missing() -> str | None:
    """Why a PostgreSQL cannot be started here (None: it can)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'officellm[cluster]')"
    if _bin_dir() is None:
        return "PostgreSQL is not installed (Debian: apt-get install postgresql)"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "running as root, and there is no setpriv to start PostgreSQL as another user"
    return None


class PostgresServer:
    """One PostgreSQL server in a temporary directory; `url()` makes a fresh database."""

    def __init__(self) -> None:
        bin_dir = _bin_dir()
        assert bin_dir is not None, missing()
        self.port = free_port()
        self._root = Path(tempfile.mkdtemp(prefix="officellm-pg-"))
        self._as = []
        if os.geteuid() == 0:
            shutil.chown(self._root, "postgres", "postgres")
            # setpriv execs (runuser would fork, and keep the signals stop() sends to itself).
            self._as = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]
        self._bin_dir = bin_dir
        subprocess.run([*self._as, str(bin_dir / "initdb"), "-D", str(self._root / "data"),
                        "-U", USER, "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "-N"],
                       check=True, capture_output=True)
        self._log = open(self._root / "postgres.log", "ab")  # noqa: SIM115 (closed in stop)
        self.start()

    def start(self) -> None:
        """Run the server (again, after `shutdown`: same port, same databases)."""
        self._proc = subprocess.Popen(
            [*self._as, str(self._bin_dir / "postgres"), "-D", str(self._root / "data"),
             "-p", str(self.port), "-k", str(self._root), "-c", "listen_addresses=127.0.0.1",
             *FAST], stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _connect(self, dbname: str = "postgres"):
        import psycopg
        return psycopg.connect(host="127.0.0.1", port=self.port, user=USER, dbname=dbname,
                               autocommit=True, connect_timeout=2)

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError("postgres exited: "
                                   + (self._root / "postgres.log").read_text()[-2000:])
            try:
                self._connect().close()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def url(self) -> str:
        """A new, empty database on this server, as officellm's --database-url."""
        name = "t_" + uuid.uuid4().hex[:12]
        with self._connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{name}"

    def shutdown(self) -> None:
        """Stop the server, keeping its databases (a database going down under its users)."""
        self._proc.send_signal(signal.SIGINT)  # fast shutdown: clients are cut off
        try:
            self._proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def stop(self) -> None:
        """Stop the server and delete its databases."""
        self.shutdown()
        self._log.close()
        shutil.rmtree(self._root, ignore_errors=True)
