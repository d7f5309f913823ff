"""A model's process of its own, as the server starts it: spawned, its log lines relayed into
the server's log, the cause of its end read from its exit and its last line; and the
child's log format. Engine cores (engine_process.py) and embedding models
(engine/embedding/encoder_process.py) run so; child_side.py is the child's half."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import IO

from officellm.engine.core_client.channel import Channel

logger = logging.getLogger("officellm.async_engine")
# How much lower in CPU priority a process loads while other models serve beside it
# (child_side.load_behind_the_others); with none to protect, a load runs at full speed.
LOAD_NICENESS = 10
# How long a process told to stop may take to finish (an engine writes its disk tier's
# queue) before it is killed.
STOP_TIMEOUT_S = 30.0


class ChildProcess:
    """`python -m module FD PARENT_PID NICENESS`, spoken to over the socket FD. Start it on the
    thread that outlives it: the child dies with that thread (child_side.die_with_parent)."""

    def __init__(self, module: str, what: str) -> None:
        self.module = module
        self.what = what  # "engine process", "embedding process": for the cause's sentence
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None
        self.last_line = ""
        self._relay: threading.Thread | None = None

    def start(self, receives: type, behind_others: bool) -> Channel:
        """Start the process; the channel to it, decoding `receives`. `behind_others`: other
        models serve beside it, so it loads at LOAD_NICENESS."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, str(theirs.fileno()), str(os.getpid()),
                 str(LOAD_NICENESS if behind_others else 0)],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.pid, self.last_line = self.proc.pid, ""
        assert self.proc.stderr is not None
        self._relay = threading.Thread(target=self._relay_log, args=(self.proc.stderr,),
                                       name=f"log-{self.pid}", daemon=True)
        self._relay.start()
        return Channel(ours, receives)

    def cause(self, label: str) -> str:
        """Why the process went (call once its channel has closed): its exit code or
        signal, and its last log line."""
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(5)
            except subprocess.TimeoutExpired:  # it closed its socket but lives: end it
                self.proc.kill()
                code = self.proc.wait()
            if self._relay is not None:
                self._relay.join(2)
        how = ("ended" if code is None else
               f"was killed by {signal.Signals(-code).name}" if code < 0 else
               f"exited with code {code}")
        last = f"; its last log line: {self.last_line}" if self.last_line else ""
        return f"the {self.what} of `{label}` (pid {self.pid}) {how}{last}"

    def wait(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Wait for the process to exit (told to stop), killing it after `timeout`."""
        proc = self.proc
        if proc is not None:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.warning("The %s %d did not stop in %.0f s: killing it", self.what,
                               proc.pid, timeout)
                proc.kill()
                proc.wait()
        if self._relay is not None:
            self._relay.join(5)
            self._relay = None
        self.proc = None

    def _relay_log(self, stream: IO[bytes]) -> None:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip()
            if line:
                self.last_line = line
            try:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):  # our stderr is closed: keep the last line only
                pass
        stream.close()


def child_logging(level: int, label: str) -> None:
    """In the child: log lines to stderr (relayed into the server's log) naming the model."""
    logging.basicConfig(level=level, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s %(name)s [{label}]: %(message)s")
