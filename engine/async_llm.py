"""AsyncLLM: the engine's asyncio client: the engine core's step loop on its own thread, its
front end on the event loop (beside LLMEngine, as in vLLM; the server is one user).

vLLM v1's split: the loop thread only schedules, executes and updates (LLMEngine.engine_core:
token ids in, tokens out, no tokenizer); everything a client reads is made on the event
loop's thread by the engine's OutputProcessor (detokenization, stop strings, n-way fan-in,
deltas), so the step loop never waits for text. Commands (add, abort, stop) reach the loop
thread through a thread-safe queue that it drains between steps; each step's outputs come
back to the event loop in one `call_soon_threadsafe`, and are handed to each request's
asyncio.Queue. When idle the loop thread blocks on the command queue: an idle server uses
no CPU.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from officellm.engine.core.request import EngineCoreRequest
from officellm.engine.core.scheduler_output import EngineCoreOutput
from officellm.engine.input_processor import InputProcessor
from officellm.engine.llm_engine import LLMEngine
from officellm.engine.model_lifecycle import (
    EngineDeadError,
    EngineState,
    LoadFailure,
    ModelLifecycle,
)
from officellm.engine.output_processor import IterationStats, OutputKind
from officellm.engine.sampling_params import SamplingParams
from officellm.engine.stats import EngineStats
from officellm.engine.structured_output import StructuredOutputsParams

if TYPE_CHECKING:
    import xgrammar as xgr

logger = logging.getLogger("officellm.async_engine")


@dataclass
class RequestAborted:
    """Put on a request's queue when the server aborts it (shutdown), so its reader ends."""

    request_id: str


class StepListener(Protocol):
    """Observes every step's latencies on the event loop (e.g. latency histograms)."""

    def on_step(self, stats: IterationStats, now: float) -> None: ...


@dataclass
class _Add:
    requests: list[EngineCoreRequest]


@dataclass
class _Abort:
    core_ids: list[str]


@dataclass
class _Purge:
    cache_salt: str | None
    done: concurrent.futures.Future


class _Stop:
    pass


class _Sleep:
    pass


class AsyncLLM(ModelLifecycle):
    """Runs the core of an LLMEngine built by `engine_factory` on a dedicated thread."""

    noun = "model"
    load_noun = "engine"
    thread_name = "engine-loop"

    def __init__(self, engine_factory: Callable[[], LLMEngine],
                 listener: StepListener | None = None,
                 on_load_failure: Callable[[LoadFailure], None] | None = None,
                 on_ready: Callable[[LLMEngine], None] | None = None) -> None:
        super().__init__(on_load_failure)
        self._factory = engine_factory
        self.listener = listener
        # Called on the loop thread once the engine has loaded, before the first request is
        # admitted: the server builds what it needs of the model (its prompt renderer).
        self.on_ready = on_ready
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, asyncio.Queue] = {}  # event loop only
        self._loop: asyncio.AbstractEventLoop | None = None
        self.engine: LLMEngine | None = None
        self._stats: EngineStats | None = None

    # -- lifecycle (event loop side) -----------------------------------------------------
    def start(self, asleep: bool = False) -> None:
        """Start the loop thread, which builds the engine (the model loads there). Called
        on the event loop that will receive the outputs. `asleep`: load nothing yet; the
        first wake() loads it (a model loaded on its first request)."""
        if self._thread is not None or self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        if asleep:
            self.state = EngineState.SLEEPING
            return
        self._start_thread()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop thread after the commands already queued; pending requests fail."""
        if self._thread is None:
            return
        self._commands.put(_Stop())
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("Engine loop thread did not stop within %.0f s", timeout)

    def sleep(self) -> bool:
        """Free the model's weights and KV pool (the loop thread closes the engine and ends)
        if no request is in it; True if it went to sleep. wake() loads it again."""
        if self.state is not EngineState.READY or self._sinks:
            return False
        self.state = EngineState.SLEEPING  # from now on add_request refuses, until wake()
        self._stats = None
        self._commands.put(_Sleep())
        return True

    def stats(self) -> EngineStats | None:
        """The latest snapshot, taken by the loop thread after each step and each command."""
        return self._stats

    # -- requests (event loop side) ------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    *, kind: OutputKind = OutputKind.DELTA, cache_salt: str | None = None,
                    fairness_key: str | None = None, priority: float = 1.0,
                    max_kv_share: float | None = None, grammar: xgr.CompiledGrammar | None = None,
                    sink: asyncio.Queue | None = None) -> asyncio.Queue:
        """Queue a request whose prompt the caller has checked (app/models/prompt.py);
        return the queue its outputs arrive on: RequestOutputs, RequestAborted, or an
        EngineDeadError instance. Several requests may share one `sink`. Raises
        EngineDeadError when the engine cannot serve.

        `cache_salt`, `fairness_key`, `priority` and `max_kv_share` are the engine's opaque
        tags (the server's per-user salt and scheduling tags, app/policy/); `grammar` is
        params.structured_outputs compiled by compile_grammar()."""
        engine = self.engine
        if self.state is not EngineState.READY or engine is None:
            raise EngineDeadError(self.unavailable_reason())
        core_requests = InputProcessor.core_requests(
            request_id, prompt_token_ids, params, cache_salt, fairness_key=fairness_key,
            priority=priority, max_kv_share=max_kv_share, grammar=grammar)
        engine.output_processor.add_request(request_id, None, core_requests, kind)
        sink = sink if sink is not None else asyncio.Queue()
        self._sinks[request_id] = sink
        self._commands.put(_Add(core_requests))
        return sink

    async def compile_grammar(self, params: StructuredOutputsParams) -> xgr.CompiledGrammar:
        """Compile a structured-output spec in a worker thread (cached per spec): the event
        loop and the engine's step loop go on meanwhile. Raises StructuredOutputError for a
        spec that cannot be honoured, EngineDeadError when the engine cannot serve."""
        engine = self.engine
        if self.state is not EngineState.READY or engine is None:
            raise EngineDeadError(self.unavailable_reason())
        return await asyncio.to_thread(engine.grammar_compiler.compile, params)

    def abort(self, request_id: str) -> None:
        """Abort a request now (its blocks are freed before the next step)."""
        self._sinks.pop(request_id, None)
        if self.engine is not None:
            core_ids = self.engine.output_processor.abort_request(request_id)
            if core_ids:
                self._commands.put(_Abort(core_ids))

    async def purge_cache_salt(self, cache_salt: str | None) -> int:
        """Forget the cached blocks computed under this prefix-cache salt, in the pool and
        the disk tier (before the engine's next step); how many. 0 for an engine not
        running: its pool is gone, and its disk tier's files are kv_disk's to purge."""
        if self.state is not EngineState.READY:
            return 0
        done: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._commands.put(_Purge(cache_salt, done))
        return await asyncio.wrap_future(done)

    def abort_all(self) -> None:
        """Abort every request; each reader gets RequestAborted (used at shutdown)."""
        for rid, sink in list(self._sinks.items()):
            self.abort(rid)
            sink.put_nowait(RequestAborted(rid))

    # -- outputs (event loop side) -------------------------------------------------------
    def _on_step(self, outputs: list[EngineCoreOutput], stats: EngineStats) -> None:
        """One step's core outputs: process them into RequestOutputs and deliver them."""
        self._stats = stats
        engine = self.engine
        if engine is None or not outputs:
            return
        processed = engine.output_processor.process_outputs(outputs)
        if processed.reqs_to_abort:
            self._commands.put(_Abort(processed.reqs_to_abort))
        if self.listener is not None:
            self.listener.on_step(processed.stats, time.monotonic())
        for out in processed.request_outputs:
            sink = self._sinks.get(out.request_id)
            if sink is None:
                continue
            if out.finished:
                del self._sinks[out.request_id]
            sink.put_nowait(out)

    def _fail_all(self, error: EngineDeadError) -> None:
        """The engine is gone: every reader gets the error."""
        for rid, sink in list(self._sinks.items()):
            if self.engine is not None:
                self.engine.output_processor.abort_request(rid)
            sink.put_nowait(error)
        self._sinks.clear()

    def _to_event_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)  # type: ignore[union-attr]
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    # -- the loop thread (ModelLifecycle's) ----------------------------------------------
    def _load(self) -> None:
        engine = self._factory()
        try:
            if self.on_ready is not None:
                self.on_ready(engine)
        except BaseException:
            engine.close()
            raise
        self.engine = engine
        self._stats = engine.engine_core.stats()

    def _serve(self) -> None:
        engine = self.engine
        assert engine is not None
        try:
            self._loop_forever(engine)
        except BaseException as exc:
            logger.exception("The engine loop died; the server now answers 503")
            self.error = f"{type(exc).__name__}: {exc}"
            self.state = EngineState.DEAD
        finally:
            # Stops tensor-parallel worker processes; nothing to do for a one-process engine.
            engine.close()

    def _free(self) -> None:
        self.engine = None

    def _after_stop(self) -> None:
        self._to_event_loop(self._fail_all, EngineDeadError(self.unavailable_reason()))

    def _loop_forever(self, engine: LLMEngine) -> None:
        core = engine.engine_core
        while True:
            # Block for a command only when there is nothing to step: no busy spinning.
            if not self._process_commands(core, block=not core.has_unfinished_requests()):
                return
            if core.has_unfinished_requests():
                outputs = core.step()
                # The snapshot travels with the outputs, so a client that has its answer
                # already sees the counters that include it.
                self._to_event_loop(self._on_step, outputs, core.stats())
            else:
                self._to_event_loop(self._on_step, [], core.stats())

    def _answer_purges_left(self) -> None:
        """Answer the purges queued behind a stop or sleep (the pool goes with the engine);
        nothing else queued then matters (adds are refused once stopping or asleep)."""
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Purge):
                cmd.done.set_result(0)

    def _process_commands(self, core: Any, block: bool) -> bool:
        """Run queued commands; False when told to stop (or to sleep)."""
        try:
            cmd = self._commands.get() if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if isinstance(cmd, (_Stop, _Sleep)):
                self._answer_purges_left()
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
