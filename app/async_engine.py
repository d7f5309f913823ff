"""AsyncEngine: the engine's step loop on its own thread, outputs streamed to asyncio queues.

The LLMEngine is not thread-safe, so exactly one thread (the loop thread) touches it. The
event loop sends commands (add, abort, stop) through a thread-safe queue that the loop thread
drains between steps; step outputs come back to each request's asyncio.Queue through
`loop.call_soon_threadsafe`, one call per step. When idle the loop thread blocks on the
command queue, so an idle server uses no CPU.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engine import EngineStats, LLMEngine, RequestOutput, SamplingParams
from engine.executor import WorkerDiedError
from engine.kv_plan import KVCacheTooSmallError

logger = logging.getLogger("officellm.async_engine")

PromptInput = str | list[int] | Callable[[LLMEngine], list[int]]


class EngineState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DEAD = "dead"  # loading failed or the loop thread crashed
    STOPPED = "stopped"


class EngineDeadError(RuntimeError):
    """The engine is not available (failed, or stopped); the request cannot be served."""


# What a load raises when the configuration cannot run (KV pool too small, no such model, an
# unsupported architecture or split, a bad flag, a tensor-parallel worker that did not start):
# its message is the whole story, so no traceback. Anything else is a bug, logged with one.
REFUSALS: tuple[type[BaseException], ...] = (KVCacheTooSmallError, FileNotFoundError, ValueError,
                                             WorkerDiedError)


@dataclass(frozen=True)
class LoadFailure:
    """Why the engine did not load: `reason` is one line for the operator (a refusal's own
    sentence, or the exception's type and message), `exception` what the factory raised."""

    reason: str
    exception: BaseException

    @classmethod
    def of(cls, exc: BaseException) -> LoadFailure:
        text = " ".join(str(exc).split())  # one line, whatever the message
        if isinstance(exc, REFUSALS) and text:
            return cls(text, exc)
        return cls(f"Loading the model failed: {type(exc).__name__}" + (f": {text}" if text else ""),
                   exc)


@dataclass
class RequestAborted:
    """Put on a request's queue when the server aborts it (shutdown), so its reader ends."""

    request_id: str


class StepListener(Protocol):
    """Observes every step on the loop thread (e.g. latency histograms)."""

    def on_outputs(self, outputs: list[RequestOutput], now: float) -> None: ...

    def on_abort(self, request_id: str) -> None: ...


@dataclass
class _Add:
    request_id: str
    prompt: PromptInput
    params: SamplingParams
    user: str | None
    thread: str | None
    cache_salt: str | None
    sink: asyncio.Queue
    accepted: asyncio.Future
    loop: asyncio.AbstractEventLoop


@dataclass
class _Abort:
    request_id: str | None  # None = every request
    notify: bool


class _Stop:
    pass


@dataclass
class _Stream:
    sink: asyncio.Queue
    loop: asyncio.AbstractEventLoop


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the event loop is closed: nobody is listening any more
        pass


def _resolve(fut: asyncio.Future, result: Any = None, exc: BaseException | None = None) -> None:
    if fut.done():  # cancelled: the client went away before acceptance
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


def _deliver(batch: list[tuple[asyncio.Queue, Any]]) -> None:
    for sink, item in batch:
        sink.put_nowait(item)


class AsyncEngine:
    """Runs an LLMEngine built by `engine_factory` on a dedicated thread."""

    def __init__(self, engine_factory: Callable[[], LLMEngine],
                 listener: StepListener | None = None,
                 on_load_failure: Callable[[LoadFailure], None] | None = None) -> None:
        self._factory = engine_factory
        self.listener = listener
        # Called once, on the loop thread, if the factory raises (after the state is DEAD
        # and pending requests have failed): `officellm serve` stops and exits non-zero.
        self.on_load_failure = on_load_failure
        self.load_failure: LoadFailure | None = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}  # loop thread only
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.state = EngineState.LOADING
        self.error: str | None = None
        self.engine: LLMEngine | None = None
        self._stats: EngineStats | None = None

    # -- lifecycle (event loop side) -----------------------------------------------------
    def start(self) -> None:
        """Start the loop thread, which builds the engine (the model loads there)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop thread after the commands already queued; pending requests fail."""
        if self._thread is None:
            return
        self._commands.put(_Stop())
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("Engine loop thread did not stop within %.0f s", timeout)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until loading has finished (or failed); True if the engine is ready."""
        self._ready.wait(timeout)
        return self.state is EngineState.READY

    @property
    def is_ready(self) -> bool:
        return self.state is EngineState.READY

    def stats(self) -> EngineStats | None:
        """The latest snapshot, taken by the loop thread after each step and each command."""
        return self._stats

    # -- requests (event loop side) ------------------------------------------------------
    async def add_request(self, request_id: str, prompt: PromptInput, params: SamplingParams, *,
                          user: str | None = None, thread: str | None = None,
                          cache_salt: str | None = None,
                          sink: asyncio.Queue | None = None) -> tuple[asyncio.Queue, list[int]]:
        """Queue a request; return (the queue its outputs arrive on, the prompt token ids).

        Raises what the engine raises on admission (PromptTooLongError, ValueError) and
        EngineDeadError. Several requests may share one `sink`. Items on the queue are
        RequestOutput deltas, RequestAborted, or an EngineDeadError instance.
        """
        if self.state is not EngineState.READY:
            raise EngineDeadError(self._unavailable_reason())
        loop = asyncio.get_running_loop()
        sink = sink if sink is not None else asyncio.Queue()
        accepted: asyncio.Future = loop.create_future()
        self._commands.put(_Add(request_id, prompt, params, user, thread, cache_salt, sink,
                                accepted, loop))
        if self.state is not EngineState.READY:
            # The loop thread ended while we queued: nobody else will answer this command.
            self._fail_commands(EngineDeadError(self._unavailable_reason()))
        token_ids = await accepted
        return sink, token_ids

    def abort(self, request_id: str) -> None:
        """Abort a request now (its blocks are freed before the next step); thread-safe."""
        self._commands.put(_Abort(request_id, notify=False))

    def abort_all(self) -> None:
        """Abort every request; each reader gets RequestAborted (used at shutdown)."""
        self._commands.put(_Abort(None, notify=True))

    def _unavailable_reason(self) -> str:
        if self.state is EngineState.LOADING:
            return "The model is still loading; try again shortly."
        if self.state is EngineState.STOPPED:
            return "The server is shutting down."
        return f"The engine failed: {self.error}"

    # -- the loop thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.engine = self._factory()
        except BaseException as exc:
            failure = LoadFailure.of(exc)
            if isinstance(exc, REFUSALS):
                logger.error("Loading the engine failed: %s", failure.reason)
            else:
                logger.exception("Loading the engine failed")
            self.load_failure = failure
            self.error = failure.reason
            self.state = EngineState.DEAD
            self._ready.set()
            self._fail_pending(EngineDeadError(self._unavailable_reason()))
            if self.on_load_failure is not None:
                try:
                    self.on_load_failure(failure)
                except Exception:
                    logger.exception("The load-failure callback failed")
            return
        self._stats = self.engine.stats()
        self.state = EngineState.READY
        self._ready.set()
        try:
            self._loop(self.engine)
        except BaseException as exc:
            logger.exception("The engine loop died; the server now answers 503")
            self.error = f"{type(exc).__name__}: {exc}"
            self.state = EngineState.DEAD
        else:
            self.state = EngineState.STOPPED
        finally:
            # Stops tensor-parallel worker processes; nothing to do for a one-process engine.
            self.engine.close()
        self._fail_pending(EngineDeadError(self._unavailable_reason()))

    def _loop(self, engine: LLMEngine) -> None:
        while True:
            # Block for a command only when there is nothing to step: no busy spinning.
            if not self._process_commands(engine, block=not engine.has_unfinished_requests()):
                return
            if engine.has_unfinished_requests():
                outputs = engine.step()
                now = time.monotonic()
                # Snapshot before delivering, so a client that has its answer already sees
                # the counters that include it.
                self._stats = engine.stats()
                if self.listener is not None:
                    self.listener.on_outputs(outputs, now)
                self._dispatch(outputs)
            else:
                self._stats = engine.stats()

    def _process_commands(self, engine: LLMEngine, block: bool) -> bool:
        """Run queued commands; False when told to stop."""
        try:
            cmd = self._commands.get() if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if isinstance(cmd, _Stop):
                return False
            if isinstance(cmd, _Add):
                self._add(engine, cmd)
            elif isinstance(cmd, _Abort):
                self._abort(engine, cmd)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(self, engine: LLMEngine, cmd: _Add) -> None:
        if cmd.accepted.cancelled():  # the client left before we got to it
            return
        try:
            token_ids = cmd.prompt(engine) if callable(cmd.prompt) else engine.encode_prompt(cmd.prompt)
            engine.add_request(cmd.request_id, token_ids, cmd.params, user=cmd.user,
                               thread=cmd.thread, cache_salt=cmd.cache_salt,
                               check_max_tokens=True)
        except Exception as exc:  # a bad request fails alone
            _call_soon(cmd.loop, _resolve, cmd.accepted, None, exc)
            return
        self._streams[cmd.request_id] = _Stream(cmd.sink, cmd.loop)
        _call_soon(cmd.loop, _resolve, cmd.accepted, token_ids)

    def _abort(self, engine: LLMEngine, cmd: _Abort) -> None:
        ids = list(self._streams) if cmd.request_id is None else [cmd.request_id]
        for rid in ids:
            engine.abort_request(rid)
            stream = self._streams.pop(rid, None)
            if self.listener is not None:
                self.listener.on_abort(rid)
            if stream is not None and cmd.notify:
                _call_soon(stream.loop, _deliver, [(stream.sink, RequestAborted(rid))])

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
            batches.setdefault(stream.loop, []).append((stream.sink, out))
        for loop, batch in batches.items():
            _call_soon(loop, _deliver, batch)

    def _fail_pending(self, error: EngineDeadError) -> None:
        """Tell every reader, and every request still in the command queue, that we failed."""
        for stream in self._streams.values():
            _call_soon(stream.loop, _deliver, [(stream.sink, error)])
        self._streams.clear()
        self._fail_commands(error)

    def _fail_commands(self, error: EngineDeadError) -> None:
        # Safe from either thread: SimpleQueue is thread-safe and each command is taken once.
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Add):
                _call_soon(cmd.loop, _resolve, cmd.accepted, None, error)
