"""ProcessCoreClient: the engine core in a process of its own (engine_process.py), so a load,
a crash or the forward's CPU time never stalls the server's other models or its HTTP.

The lifecycle thread that calls load() starts the process, and the same thread serve()s:
it reads the process's messages and hands each step to the event loop, so it outlives the
process (the process's death signal is tied to it: child_process.py).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Callable

from officellm.engine.config import EngineConfig
from officellm.engine.core.request import EngineCoreRequest
from officellm.engine.core_client import wire
from officellm.engine.core_client.channel import Channel
from officellm.engine.core_client.child_process import ChildProcess
from officellm.engine.core_client.core_client import (
    GRAMMAR_IN_CORE,
    EngineCoreDied,
    EngineLoadError,
    LoadedCore,
    StepCallback,
)
from officellm.engine.frontend.front_end import EngineFrontEnd
from officellm.engine.structured_output import StructuredOutputError, StructuredOutputsParams

ENGINE_PROCESS = "officellm.engine.core_client.engine_process"


class ProcessCoreClient:
    """Starts an engine process per load for the config `config()` returns then, behind
    the models serving beside it when `others_serving()` says there are some."""

    def __init__(self, config: Callable[[], EngineConfig], label: Callable[[], str],
                 others_serving: Callable[[], bool]) -> None:
        self._config = config
        self._label = label
        self._others_serving = others_serving
        self._child = ChildProcess(ENGINE_PROCESS, "engine process")
        self._channel: Channel | None = None
        self._calls = itertools.count()
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._pending_lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self._child.pid

    # -- the lifecycle thread ------------------------------------------------------------
    def load(self) -> LoadedCore:
        config, label = self._config(), self._label()
        self._channel = self._child.start(wire.FromEngine, self._others_serving())
        self._channel.send(wire.Start(config, label, logging.getLogger().getEffectiveLevel()))
        message = self._channel.receive()
        if isinstance(message, wire.Ready):
            # The tokenizer loads here, on this thread: the event loop goes on meanwhile.
            return LoadedCore(EngineFrontEnd(message.info), message.stats)
        if isinstance(message, wire.LoadFailed):
            self.close()
            raise EngineLoadError(message.reason)
        cause = self._child.cause(label)
        self.close()
        raise EngineCoreDied(cause)

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
                cause = self._child.cause(self._label())
                self._fail_pending(EngineCoreDied(cause))
                raise EngineCoreDied(cause)

    def close(self) -> None:
        self._child.wait()
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        self._fail_pending(EngineCoreDied("the engine process has stopped"))

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
