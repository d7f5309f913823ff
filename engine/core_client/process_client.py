"""ProcessCoreClient: the engine core in a process of its own (engine_process.py), so a load,
a crash or the forward's CPU time never stalls the server's other models or its HTTP.

The lifecycle thread that calls load() starts the process, and the same thread serve()s:
it reads the process's messages and hands each step to the event loop, so it outlives the
process (the process's death signal is tied to it). The process's log lines are relayed to
this process's stderr; the last one is kept for the cause of a death.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO

from officellm.engine.config import EngineConfig
from officellm.engine.core.request import EngineCoreRequest
from officellm.engine.core_client import wire
from officellm.engine.core_client.core_client import (
    GRAMMAR_IN_CORE,
    EngineCoreDied,
    EngineLoadError,
    LoadedCore,
    StepCallback,
)
from officellm.engine.front_end import EngineFrontEnd
from officellm.engine.structured_output import StructuredOutputError, StructuredOutputsParams

logger = logging.getLogger("officellm.async_engine")
# How long a process told to stop may take to write its disk tier's queue and exit.
STOP_TIMEOUT_S = 30.0


class ProcessCoreClient:
    """Starts an engine process per load for the config `config()` returns then."""

    def __init__(self, config: Callable[[], EngineConfig], label: Callable[[], str]) -> None:
        self._config = config
        self._label = label
        self._proc: subprocess.Popen[bytes] | None = None
        self._channel: wire.Channel | None = None
        self._relay: threading.Thread | None = None
        self._last_line = ""
        self._calls = itertools.count()
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._pending_lock = threading.Lock()
        self.pid: int | None = None

    # -- the lifecycle thread ------------------------------------------------------------
    def load(self) -> LoadedCore:
        config, label = self._config(), self._label() or "default"
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "officellm.engine.core_client.engine_process",
                 str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        finally:
            theirs.close()
        self.pid = self._proc.pid
        self._last_line = ""
        assert self._proc.stderr is not None
        self._relay = threading.Thread(target=self._relay_log, args=(self._proc.stderr,),
                                       name=f"engine-log-{self.pid}", daemon=True)
        self._relay.start()
        self._channel = wire.Channel(ours, wire.FromEngine)
        self._channel.send(wire.Start(config, label, logging.getLogger().getEffectiveLevel()))
        message = self._channel.receive()
        if isinstance(message, wire.Ready):
            # The tokenizer loads here, on this thread: the event loop goes on meanwhile.
            return LoadedCore(EngineFrontEnd(message.info), message.stats)
        self.close()
        if isinstance(message, wire.LoadFailed):
            raise EngineLoadError(message.reason)
        raise EngineCoreDied(self._cause(label))

    def serve(self, on_step: StepCallback) -> None:
        assert self._channel is not None
        while True:
            message = self._channel.receive()
            if isinstance(message, wire.Step):
                on_step(message.outputs, message.stats)
            elif isinstance(message, (wire.Purged, wire.Compiled)):
                self._answer(message)
            elif isinstance(message, wire.Stopped):
                return
            elif message is None:
                cause = self._cause(self._label() or "default")
                self._fail_pending(EngineCoreDied(cause))
                raise EngineCoreDied(cause)

    def close(self) -> None:
        proc = self._proc
        if proc is not None:
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                logger.warning("The engine process %d did not stop in %.0f s: killing it",
                               proc.pid, STOP_TIMEOUT_S)
                proc.kill()
                proc.wait()
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._relay is not None:
            self._relay.join(5)
            self._relay = None
        self._fail_pending(EngineCoreDied("the engine process has stopped"))
        self._proc = None

    def _cause(self, label: str) -> str:
        """Why the process went: its exit code or signal and its last log line."""
        proc = self._proc
        code = None
        if proc is not None:
            try:
                code = proc.wait(5)
            except subprocess.TimeoutExpired:  # it closed its socket but lives: end it
                proc.kill()
                code = proc.wait()
            if self._relay is not None:
                self._relay.join(2)
        how = ("ended" if code is None else
               f"was killed by {signal.Signals(-code).name}" if code < 0 else
               f"exited with code {code}")
        last = f"; its last log line: {self._last_line}" if self._last_line else ""
        return f"the engine process of `{label}` (pid {self.pid}) {how}{last}"

    def _relay_log(self, stream: IO[bytes]) -> None:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip()
            if line:
                self._last_line = line
            try:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):  # our stderr is closed: keep the last line only
                pass
        stream.close()

    # -- commands (any thread) -----------------------------------------------------------
    def stop(self) -> None:
        if self._channel is not None:
            self._channel.send(wire.Stop())

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        if self._channel is not None:
            self._channel.send(wire.Add([wire.WireRequest.of(r) for r in requests]))

    def abort_requests(self, core_ids: list[str]) -> None:
        if self._channel is not None:
            self._channel.send(wire.Abort(core_ids))

    def purge_cache_salt(self, cache_salt: str | None) -> concurrent.futures.Future[int]:
        call, done = self._call()
        if self._channel is None or not self._channel.send(wire.Purge(call, cache_salt)):
            self._settle(call, 0)
        return done

    def compile_grammar(self, params: StructuredOutputsParams) -> object:
        """Compile in the engine process (its cache then serves the request's Add)."""
        call, done = self._call()
        if self._channel is None or not self._channel.send(wire.Compile(call, params)):
            self._settle(call, EngineCoreDied("the engine process has stopped"))
        error = done.result()
        if error is not None:
            raise StructuredOutputError(error)
        return GRAMMAR_IN_CORE

    def _call(self) -> tuple[int, concurrent.futures.Future]:
        call, done = next(self._calls), concurrent.futures.Future()
        with self._pending_lock:
            self._pending[call] = done
        return call, done

    def _settle(self, call: int, result: object) -> None:
        with self._pending_lock:
            done = self._pending.pop(call, None)
        if done is None:
            return
        if isinstance(result, BaseException):
            done.set_exception(result)
        else:
            done.set_result(result)

    def _answer(self, message: wire.Purged | wire.Compiled) -> None:
        if isinstance(message, wire.Purged):
            self._settle(message.call, message.dropped if message.error is None
                         else RuntimeError(message.error))
        else:
            self._settle(message.call, message.error)

    def _fail_pending(self, error: BaseException) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        for done in pending.values():
            done.set_exception(error)
