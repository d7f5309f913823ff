"""Manage an `officellm serve` on this desk: start it detached, find it again, stop it.

The server runs in its own session (`start_new_session=True`) with its output in a log file,
so closing the console leaves it serving. A small JSON state file (pid, port, log path, the
command line) lets the next console find it and reattach; a stale file (the process is gone,
or the pid now belongs to something else) is ignored and removed.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from officellm.installer.paths import ADMIN_TOKEN_FILENAME, DATA_DIR_ENV, default_data_dir

STATE_FILENAME = "local_server.json"


def console_dir() -> Path:
    """Where the console keeps its state file and the server logs it starts."""
    return default_data_dir() / "console"


@dataclass
class LaunchConfig:
    """What the Start button launches. `data_dir` is the server's data dir (its database and
    `admin_token` file); `extra_flags` is a shell-quoted string of further serve flags."""

    model: str = ""
    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: str = ""
    extra_flags: str = ""
    python: str = field(default_factory=lambda: sys.executable)

    def resolved_data_dir(self) -> Path:
        return Path(self.data_dir).expanduser() if self.data_dir else default_data_dir()

    def argv(self) -> list[str]:
        # `python -m officellm.cli` rather than the `officellm` script: the console's own
        # interpreter always has the package, whether installed or run from a checkout.
        args = [self.python, "-m", "officellm.cli", "serve"]
        if self.model:
            args.append(self.model)
        args += ["--host", self.host, "--port", str(self.port)]
        args += shlex.split(self.extra_flags)
        return args

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def admin_token_path(self) -> Path:
        """Where this server will write its admin token: beside its database, which is
        `--db` when the flags give one, else in the data dir."""
        flags = shlex.split(self.extra_flags)
        for i, flag in enumerate(flags):
            if flag == "--db" and i + 1 < len(flags):
                return Path(flags[i + 1]).expanduser().parent / ADMIN_TOKEN_FILENAME
            if flag.startswith("--db="):
                return Path(flag[5:]).expanduser().parent / ADMIN_TOKEN_FILENAME
        return self.resolved_data_dir() / ADMIN_TOKEN_FILENAME


@dataclass
class ServerRecord:
    """The state file's content: enough to find, watch and stop a server we started."""

    pid: int
    port: int
    host: str
    log_path: str
    data_dir: str
    argv: list[str]
    started: float
    token_path: str = ""  # empty in state files of older consoles: the data dir's

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def admin_token_path(self) -> Path:
        return Path(self.token_path) if self.token_path else \
            Path(self.data_dir) / ADMIN_TOKEN_FILENAME


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _looks_like_our_server(record: ServerRecord) -> bool:
    """The pid still runs `serve` on the recorded port (guards against pid reuse)."""
    if not pid_alive(record.pid) or _is_zombie(record.pid):
        return False
    cmdline = Path(f"/proc/{record.pid}/cmdline")
    if not cmdline.exists():
        return True  # not Linux: trust the pid
    try:
        args = cmdline.read_bytes().split(b"\0")
    except OSError:
        return False
    return b"serve" in args and str(record.port).encode() in args


def port_in_use(host: str, port: int) -> bool:
    target = "127.0.0.1" if host in ("0.0.0.0", "") else host
    try:
        with socket.create_connection((target, port), timeout=0.5):
            return True
    except OSError:
        return False


def read_log_tail(path: str | Path, max_bytes: int = 16_384) -> str:
    """The end of a log file, starting at a line boundary."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    if size > max_bytes and "\n" in text:
        text = text.split("\n", 1)[1]
    return text


def last_line(text: str) -> str:
    """The last non-blank line of a log: where `officellm serve` puts why it did not start."""
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return ""


class LocalServer:
    """The one local server this console manages (per state directory)."""

    def __init__(self, state_dir: Path | None = None) -> None:
        self.state_dir = Path(state_dir) if state_dir else console_dir()
        self.record: ServerRecord | None = None
        self._popen: subprocess.Popen | None = None
        self.exit_code: int | None = None

    @property
    def state_path(self) -> Path:
        return self.state_dir / STATE_FILENAME

    # --- state file ------------------------------------------------------------------------
    def _save(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self.record), indent=2))
        os.replace(tmp, self.state_path)

    def _forget(self) -> None:
        self.record = None
        try:
            self.state_path.unlink()
        except FileNotFoundError:
            pass

    def reattach(self) -> ServerRecord | None:
        """Find the server a previous console started; None (and a cleaned-up state file)
        when there is none or it has gone."""
        try:
            record = ServerRecord(**json.loads(self.state_path.read_text()))
        except (OSError, ValueError, TypeError):
            return None
        if not _looks_like_our_server(record):
            self._forget()
            return None
        self.record = record
        return record

    # --- lifecycle -----------------------------------------------------------------------
    def start(self, config: LaunchConfig) -> ServerRecord:
        """Launch `officellm serve` detached; returns at once (the model loads in the
        background: watch the port or the log)."""
        if self.is_running():
            raise RuntimeError(f"a server is already running (pid {self.record.pid}, "
                               f"port {self.record.port})")
        # Otherwise the new server would fail to bind while the console, polling that port,
        # showed whatever else answers there as if it were ours.
        if port_in_use(config.host, config.port):
            raise RuntimeError(f"port {config.port} is already in use on {config.host}; stop "
                               "what listens there or choose another port")
        data_dir = config.resolved_data_dir()
        data_dir.mkdir(parents=True, exist_ok=True)
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"serve-{config.port}.log"
        env = dict(os.environ, **{DATA_DIR_ENV: str(data_dir)})
        argv = config.argv()
        with open(log_path, "ab") as log:
            log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} console starts: "
                      f"{shlex.join(argv)}\n".encode())
            log.flush()
            self._popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, close_fds=True)
        self.exit_code = None
        self.record = ServerRecord(pid=self._popen.pid, port=config.port, host=config.host,
                                   log_path=str(log_path), data_dir=str(data_dir), argv=argv,
                                   started=time.time(),
                                   token_path=str(config.admin_token_path()))
        self._save()
        return self.record

    def is_running(self) -> bool:
        """True while the recorded server process lives; notes its exit code if it was ours."""
        if self.record is None:
            return False
        if self._popen is not None and self._popen.pid == self.record.pid:
            code = self._popen.poll()  # reaps it, so a crashed child is no zombie
            if code is not None:
                self.exit_code = code
                return False
            return True
        return _looks_like_our_server(self.record)

    def stop(self, timeout: float = 45.0) -> int | None:
        """SIGTERM (the server drains in-flight requests), then SIGKILL after `timeout`.
        Blocks: call it from a worker thread. Returns the exit code when known."""
        if self.record is None:
            return None
        pid = self.record.pid
        if self.is_running():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout
            while self.is_running() and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.is_running():
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                end = time.monotonic() + 5
                while self.is_running() and time.monotonic() < end:
                    time.sleep(0.05)
        code = self.exit_code
        self._popen = None
        self._forget()
        return code

    def log_tail(self, max_bytes: int = 16_384) -> str:
        return read_log_tail(self.record.log_path, max_bytes) if self.record else ""

    def failure_reason(self) -> str | None:
        """Why the server we started exited with an error: the last line of its log (a start
        that fails ends with its reason: `officellm serve` exits 1 with it as its last line).
        None while it runs, after a clean exit or a signal (then the last line is just the
        last thing it logged), or when another console started it (its exit code is lost)."""
        if self.record is None or self.is_running() or not self.exit_code or self.exit_code < 0:
            return None
        line = last_line(self.log_tail())
        if not line or (line.startswith("--- ") and "console starts:" in line):
            return None  # it printed nothing at all: only our own header is there
        return line
