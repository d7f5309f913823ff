"""AsyncLLM: the engine's asyncio client: the engine core behind an EngineCoreClient (on a
thread of its own, or in a process of its own: engine/core_client/), its front end on the
event loop (beside LLMEngine, as in vLLM; the server is one user).

vLLM v1's split: the core only schedules, executes and updates (token ids in, tokens out,
no tokenizer); everything a client reads is made on the event loop's thread by the front
end's OutputProcessor (detokenization, stop strings, n-way fan-in, deltas), so the step loop
never waits for text. Commands (add, abort, purge, stop) go to the core through the client,
which drains them between steps; each step's outputs come back to the event loop in one
`call_soon_threadsafe` and are handed to each request's asyncio.Queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from officellm.engine.config import EngineConfig
from officellm.engine.core.scheduler_output import EngineCoreOutput
from officellm.engine.core_client.core_client import EngineCoreClient, EngineCoreDied
from officellm.engine.core_client.inproc_client import InprocCoreClient
from officellm.engine.core_client.process_client import ProcessCoreClient
from officellm.engine.frontend.front_end import EngineFrontEnd
from officellm.engine.frontend.input_processor import InputProcessor
from officellm.engine.frontend.output_processor import IterationStats, OutputKind
from officellm.engine.frontend.sampling_params import SamplingParams
from officellm.engine.llm_engine import LLMEngine
from officellm.engine.model_lifecycle import (
    EngineDeadError,
    EngineState,
    LoadFailure,
    ModelLifecycle,
)
from officellm.engine.multimodal.inputs import ImageInputError, MultiModalPrompt
from officellm.engine.stats import EngineStats
from officellm.engine.structured_output import StructuredOutputsParams

logger = logging.getLogger("officellm.async_engine")


@dataclass
class RequestAborted:
    """Put on a request's queue when the server aborts it (shutdown), so its reader ends."""

    request_id: str


class StepListener(Protocol):
    """Observes every step's latencies on the event loop (e.g. latency histograms)."""

    def on_step(self, stats: IterationStats, now: float) -> None: ...


class AsyncLLM(ModelLifecycle):
    """Drives one engine core through `client` (in_process() or in_own_process())."""

    noun = "model"
    load_noun = "engine"
    thread_name = "engine-loop"

    def __init__(self, client: EngineCoreClient, listener: StepListener | None = None,
                 on_load_failure: Callable[[LoadFailure], None] | None = None,
                 on_ready: Callable[[EngineFrontEnd], None] | None = None) -> None:
        super().__init__(on_load_failure)
        self.client = client
        self.listener = listener
        # Called on the lifecycle thread once the engine has loaded, before the first
        # request is admitted: the server builds what it needs of the model (its prompt
        # renderer) from the front end.
        self.on_ready = on_ready
        self._sinks: dict[str, asyncio.Queue] = {}  # event loop only
        self._loop: asyncio.AbstractEventLoop | None = None
        self.front_end: EngineFrontEnd | None = None
        self._stats: EngineStats | None = None

    @classmethod
    def in_process(cls, engine_factory: Callable[[], LLMEngine], **kwargs: Any) -> AsyncLLM:
        """The core on a thread of this process (the offline LLM's users, the tests)."""
        return cls(InprocCoreClient(engine_factory), **kwargs)

    @classmethod
    def in_own_process(cls, config: Callable[[], EngineConfig], label: Callable[[], str],
                       others_serving: Callable[[], bool], **kwargs: Any) -> AsyncLLM:
        """The core in a process of its own, started per load with `config()` (the
        server's default): a crash or a load there stalls nothing here, and it loads behind
        the models serving beside it when `others_serving()`."""
        return cls(ProcessCoreClient(config, label, others_serving), **kwargs)

    # -- lifecycle (event loop side) -----------------------------------------------------
    def start(self, asleep: bool = False) -> None:
        """Start the lifecycle thread, which loads the core. Called on the event loop that
        will receive the outputs. `asleep`: load nothing yet; the first wake() loads it (a
        model loaded on its first request)."""
        if self._thread is not None or self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        if asleep:
            self.state = EngineState.SLEEPING
            return
        self._start_thread()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the core after the commands already sent; pending requests fail."""
        if self._thread is None:
            return
        self.client.stop()
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("Engine loop thread did not stop within %.0f s", timeout)

    def sleep(self) -> bool:
        """Free the model's weights and KV pool (the core closes and its thread ends) if no
        request is in it; True if it went to sleep. wake() loads it again."""
        if self.state is not EngineState.READY or self._sinks:
            return False
        self.state = EngineState.SLEEPING  # from now on add_request refuses, until wake()
        self._stats = None
        self.client.stop()
        return True

    def stats(self) -> EngineStats | None:
        """The latest snapshot, taken by the core after each step and each command."""
        return self._stats

    @property
    def engine_pid(self) -> int | None:
        """The engine process's id while the core runs in one (None in-process)."""
        return self.client.pid if self.state is EngineState.READY else None

    # -- requests (event loop side) ------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    *, kind: OutputKind = OutputKind.DELTA, cache_salt: str | None = None,
                    fairness_key: str | None = None, priority: float = 1.0,
                    max_kv_share: float | None = None, background: bool = False,
                    grammar: object | None = None,
                    sink: asyncio.Queue | None = None,
                    multimodal: MultiModalPrompt | None = None) -> asyncio.Queue:
        """Queue a request whose prompt the caller has checked (app/models/prompt.py);
        return the queue its outputs arrive on: RequestOutputs, RequestAborted, or an
        EngineDeadError instance. Several requests may share one `sink`. Raises
        EngineDeadError when the engine cannot serve.

        `cache_salt`, `fairness_key`, `priority` and `max_kv_share` are the engine's opaque
        tags (the server's per-user salt and scheduling tags, app/policy/); `background`
        marks work nobody waits to read (a front end's task), which yields to every other
        request's prompt work (engine/core/scheduler.py); `grammar` is
        what compile_grammar() returned for params.structured_outputs; `multimodal` a
        prompt with images (front_end.multimodal_processor's, its token_ids
        `prompt_token_ids`): ImageInputError on a model without vision (EngineInfo.vision)."""
        front_end = self.front_end
        if self.state is not EngineState.READY or front_end is None:
            raise EngineDeadError(self.unavailable_reason())
        if multimodal is not None and not front_end.info.vision:
            raise ImageInputError(f"The model {front_end.model_name} does not take images.")
        core_requests = InputProcessor.core_requests(
            request_id, prompt_token_ids, params, cache_salt, fairness_key=fairness_key,
            priority=priority, max_kv_share=max_kv_share, background=background,
            grammar=grammar, multimodal=multimodal)  # type: ignore[arg-type]
        front_end.output_processor.add_request(request_id, None, core_requests, kind)
        sink = sink if sink is not None else asyncio.Queue()
        self._sinks[request_id] = sink
        self.client.add_requests(core_requests)
        return sink

    async def compile_grammar(self, params: StructuredOutputsParams) -> object:
        """Compile a structured-output spec off the event loop (cached per spec; in the
        engine's process when it has one): the event loop and the step loop go on
        meanwhile. Raises StructuredOutputError for a spec that cannot be honoured,
        EngineDeadError when the engine cannot serve."""
        if self.state is not EngineState.READY:
            raise EngineDeadError(self.unavailable_reason())
        try:
            return await asyncio.to_thread(self.client.compile_grammar, params)
        except EngineCoreDied as exc:
            raise EngineDeadError(f"The {self.load_noun} stopped: {exc}") from exc

    def abort(self, request_id: str) -> None:
        """Abort a request now (its blocks are freed before the next step)."""
        self._sinks.pop(request_id, None)
        if self.front_end is not None:
            core_ids = self.front_end.output_processor.abort_request(request_id)
            if core_ids:
                self.client.abort_requests(core_ids)

    async def purge_cache_salt(self, cache_salt: str | None) -> int:
        """Forget the cached blocks computed under this prefix-cache salt, in the pool and
        the tiers below it (before the engine's next step); how many. 0 for an engine not
        running: its pool is gone, and its disk tier's files are kv_disk's to purge."""
        if self.state is not EngineState.READY:
            return 0
        try:
            return await asyncio.wrap_future(self.client.purge_cache_salt(cache_salt))
        except EngineCoreDied:  # its pool went with it
            return 0

    def abort_all(self) -> None:
        """Abort every request; each reader gets RequestAborted (used at shutdown)."""
        for rid, sink in list(self._sinks.items()):
            self.abort(rid)
            sink.put_nowait(RequestAborted(rid))

    # -- outputs (event loop side) -------------------------------------------------------
    def _on_step(self, outputs: list[EngineCoreOutput], stats: EngineStats | None) -> None:
        """One step's core outputs: process them into RequestOutputs and deliver them."""
        if stats is not None:
            self._stats = stats
        front_end = self.front_end
        if front_end is None or not outputs:
            return
        processed = front_end.output_processor.process_outputs(outputs)
        if processed.reqs_to_abort:
            self.client.abort_requests(processed.reqs_to_abort)
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
            if self.front_end is not None:
                self.front_end.output_processor.abort_request(rid)
            sink.put_nowait(error)
        self._sinks.clear()

    def _to_event_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)  # type: ignore[union-attr]
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    # -- the lifecycle thread (ModelLifecycle's) -----------------------------------------
    def _load(self) -> None:
        loaded = self.client.load()
        try:
            if self.on_ready is not None:
                self.on_ready(loaded.front_end)
        except BaseException:
            self.client.stop()
            self.client.close()
            raise
        self.front_end = loaded.front_end
        self._stats = loaded.stats

    def _serve(self) -> None:
        try:
            self.client.serve(lambda outputs, stats: self._to_event_loop(self._on_step, outputs,
                                                                          stats))
        except BaseException as exc:
            if isinstance(exc, EngineCoreDied):
                logger.error("The engine stopped: %s", exc)
            else:
                logger.exception("The engine loop died; its requests get 503 and the next "
                                 "request starts it again")
            self.crashed(str(exc) if isinstance(exc, EngineCoreDied)
                         else f"{type(exc).__name__}: {exc}")
        finally:
            self.client.close()

    def _free(self) -> None:
        self.front_end = None

    def _after_stop(self) -> None:
        self._to_event_loop(self._fail_all, EngineDeadError(self.unavailable_reason()))
