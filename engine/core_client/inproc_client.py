"""InprocCoreClient: the engine core on the lifecycle thread of this process (LLM's users,
the tests, `officellm serve --engine-in-process`, and the core inside an engine process).

Commands reach the loop through a thread-safe queue that it drains between steps; when idle
the loop blocks on that queue, so an idle engine uses no CPU.
"""

from __future__ import annotations

import concurrent.futures
import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from officellm.engine.core.request import EngineCoreRequest
from officellm.engine.core_client.core_client import LoadedCore, StepCallback
from officellm.engine.engine_core import EngineCore
from officellm.engine.llm_engine import LLMEngine
from officellm.engine.structured_output import StructuredOutputsParams


@dataclass
class _Add:
    requests: list[EngineCoreRequest]


@dataclass
class _Abort:
    core_ids: list[str]


@dataclass
class _Purge:
    cache_salt: str | None
    done: concurrent.futures.Future[int]


class _Stop:
    pass


class InprocCoreClient:
    """Runs the core of an LLMEngine built by `engine_factory` on the calling thread."""

    def __init__(self, engine_factory: Callable[[], LLMEngine]) -> None:
        self._factory = engine_factory
        self._commands: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.engine: LLMEngine | None = None
        self.pid: int | None = None  # this process's

    def load(self) -> LoadedCore:
        self._commands = queue.SimpleQueue()  # nothing of a previous load's carries over
        engine = self._factory()
        self.engine = engine
        return LoadedCore(engine.front_end, engine.engine_core.stats())

    def serve(self, on_step: StepCallback) -> None:
        assert self.engine is not None
        core = self.engine.engine_core
        while True:
            # Block for a command only when there is nothing to step: no busy spinning.
            if not self._process_commands(core, block=not core.has_unfinished_requests()):
                self._answer_purges_left()
                return
            # The snapshot travels with the outputs, so a client that has its answer
            # already sees the counters that include it.
            outputs = core.step() if core.has_unfinished_requests() else []
            on_step(outputs, core.stats())

    def close(self) -> None:
        if self.engine is not None:
            # Stops tensor-parallel worker processes and writes the disk tier's queue.
            self.engine.close()
            self.engine = None

    def stop(self) -> None:
        self._commands.put(_Stop())

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        self._commands.put(_Add(requests))

    def abort_requests(self, core_ids: list[str]) -> None:
        self._commands.put(_Abort(core_ids))

    def purge_cache_salt(self, cache_salt: str | None) -> concurrent.futures.Future[int]:
        done: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._commands.put(_Purge(cache_salt, done))
        return done

    def compile_grammar(self, params: StructuredOutputsParams) -> object:
        engine = self.engine
        assert engine is not None, "only while loaded"
        return engine.grammar_compiler.compile(params)

    # -- the loop's side -----------------------------------------------------------------
    def _answer_purges_left(self) -> None:
        """Answer the purges queued behind a stop (the pool goes with the engine); nothing
        else queued then matters (the front end refuses adds once stopping)."""
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Purge):
                cmd.done.set_result(0)

    def _process_commands(self, core: EngineCore, block: bool) -> bool:
        """Run queued commands; False when told to stop."""
        try:
            cmd = self._commands.get() if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if isinstance(cmd, _Stop):
                return False
            if isinstance(cmd, _Add):
                for request in cmd.requests:
                    core.add_request(request)
            elif isinstance(cmd, _Abort):
                core.abort_requests(cmd.core_ids)
            elif isinstance(cmd, _Purge):
                try:
                    cmd.done.set_result(core.purge_cache_salt(cmd.cache_salt))
                except Exception as exc:  # noqa: BLE001 - the caller hears of it
                    cmd.done.set_exception(exc)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return True
