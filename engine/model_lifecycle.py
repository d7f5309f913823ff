"""The lifecycle a served model's front end shares (AsyncLLM's engine, AsyncEmbedder's
encoder): loaded on a thread of its own, which then serves; asleep (the model freed, its
thread ended) when idle; loaded again by the next wake(). Each subclass says how it loads,
serves, frees and fails what is waiting."""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from officellm.engine.host_memory import release_freed_memory
from officellm.engine.kv_plan import KVCacheTooSmallError
from officellm.engine.worker.multiproc_executor import WorkerDiedError

logger = logging.getLogger("officellm.async_engine")


class EngineState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DEAD = "dead"  # loading failed, or the core stopped untold (crashed(): restartable)
    STOPPED = "stopped"
    SLEEPING = "sleeping"  # idle: the model's weights and KV pool freed until wake()


# A core that crashed starts again on the next request; one that crashes again within this
# window waits first, twice as long each time (restart_delay), so a model that cannot run
# does not take the machine's CPU loading again and again.
CRASH_WINDOW_S = 300.0
MAX_RESTART_DELAY_S = 60.0


def restart_delay(crashes: int) -> float:
    """Seconds to wait after the last of `crashes` crashes within CRASH_WINDOW_S."""
    return 0.0 if crashes <= 1 else min(2.0 ** (crashes - 1), MAX_RESTART_DELAY_S)


class EngineCoreDied(RuntimeError):
    """A core (or an embedding model) stopped without being told to: its process was killed
    or exited, or its loop raised. The message is the cause, in a sentence for the operator
    and the client."""


class EngineLoadError(RuntimeError):
    """A core elsewhere could not load its model: the message is its one-line reason (the
    core logged the traceback where it ran)."""


class EngineDeadError(RuntimeError):
    """The engine is not available (failed, or stopped); the request cannot be served."""


# What a load raises when the configuration cannot run (KV pool too small, no such model, an
# unsupported architecture or split, a bad flag, a tensor-parallel worker that did not start,
# an engine process that said why or died): its message is the whole story, so no traceback.
# Anything else is a bug, logged with one.
REFUSALS: tuple[type[BaseException], ...] = (KVCacheTooSmallError, FileNotFoundError, ValueError,
                                             WorkerDiedError, EngineLoadError, EngineCoreDied)


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


def report_load_failure(failure: LoadFailure, what: str,
                        callback: Callable[[LoadFailure], None] | None) -> None:
    """Log why loading `what` failed (a refusal in its own sentence, anything else with its
    traceback) and tell `callback`."""
    if isinstance(failure.exception, REFUSALS):
        logger.error("Loading the %s failed: %s", what, failure.reason)
    else:
        logger.error("Loading the %s failed", what, exc_info=failure.exception)
    if callback is not None:
        try:
            callback(failure)
        except Exception:
            logger.exception("The load-failure callback failed")


class ModelLifecycle:
    """Loading, serving, sleep and wake on one thread per load. A subclass names what it
    serves (`noun`, for the client's messages, and `load_noun`, for the log), loads it
    (`_load`), serves until told to stop or sleep (`_serve`), frees it (`_free`) and
    answers what waits once it stops for good (`_after_stop`)."""

    noun = "model"
    load_noun = "model"
    thread_name = "model"

    def __init__(self, on_load_failure: Callable[[LoadFailure], None] | None) -> None:
        # Called once, on the thread, if the first load fails (after the state is DEAD):
        # `officellm serve` stops and exits non-zero. A failed wake() does not call it: a
        # server that started is not stopped by it.
        self.on_load_failure = on_load_failure
        self.load_failure: LoadFailure | None = None
        self.state = EngineState.LOADING
        self.error: str | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._waking: asyncio.Future[bool] | None = None
        self._crashes: list[float] = []  # when the core stopped untold, within the window

    # -- the subclass's ------------------------------------------------------------------
    def _load(self) -> None:
        """Load the model (on the thread); raise if it cannot be."""
        raise NotImplementedError

    def _serve(self) -> None:
        """Serve until told to stop or sleep; call crashed() if the core stops otherwise."""
        raise NotImplementedError

    def _free(self) -> None:
        """Drop the model (asleep now)."""
        raise NotImplementedError

    def _after_stop(self) -> None:
        """The thread ends for good (stopped or dead): fail what still waits."""
        raise NotImplementedError

    # -- lifecycle -----------------------------------------------------------------------
    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    async def wake(self) -> bool:
        """Load the model again after a sleep (or a start asleep, or a crash once its
        back-off has passed); True once it is ready. False if loading failed: it then stays
        asleep, `error` says why, and the next wake() tries again. Concurrent callers share
        one load."""
        if self._waking is None:
            if self.restartable:
                if self.restart_in() > 0:
                    return False
            elif self.state is not EngineState.SLEEPING:
                return self.is_ready
            self._waking = asyncio.ensure_future(self._reload())
        return await asyncio.shield(self._waking)

    def crashed(self, cause: str) -> None:
        """The core stopped untold (called on the thread by _serve): requests waiting fail
        with `cause`, and the next request starts it again (restart_delay)."""
        now = time.monotonic()
        self._crashes = [t for t in self._crashes if now - t < CRASH_WINDOW_S] + [now]
        self.error, self.state = cause, EngineState.DEAD

    @property
    def restartable(self) -> bool:
        """It crashed while serving: a wake() starts it again (after restart_in())."""
        return self.state is EngineState.DEAD and bool(self._crashes)

    def restart_in(self) -> float:
        """Seconds until a crashed core may start again (0: now)."""
        if not self._crashes:
            return 0.0
        now = time.monotonic()
        recent = [t for t in self._crashes if now - t < CRASH_WINDOW_S]
        return max(0.0, self._crashes[-1] + restart_delay(len(recent)) - now)

    async def _reload(self) -> bool:
        restarting = self.restartable  # after a crash: a failed load is one crash more
        try:
            if self._thread is not None:  # the sleeping thread frees the model first
                await asyncio.to_thread(self._thread.join)
            self._ready.clear()
            self.state = EngineState.LOADING
            self._start_thread()
            await asyncio.to_thread(self._ready.wait)
            if self.state is EngineState.DEAD:
                if restarting:  # a crash loop in the load waits its back-off too
                    self.crashed(self.error or "its load failed")
                else:  # asleep again: the next request retries
                    self.state = EngineState.SLEEPING
                return False
            if self.state is EngineState.READY:
                self.error = None
            return self.state is EngineState.READY
        finally:
            self._waking = None

    async def until_asleep(self) -> None:
        """Wait until a sleep has freed the model (its thread has ended)."""
        thread = self._thread
        if self.state is EngineState.SLEEPING and thread is not None and self._waking is None:
            await asyncio.to_thread(thread.join)

    @property
    def waking(self) -> bool:
        """A wake() is loading the model now."""
        return self._waking is not None

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until loading has finished (or failed); True if it is ready."""
        self._ready.wait(timeout)
        return self.state is EngineState.READY

    @property
    def is_ready(self) -> bool:
        return self.state is EngineState.READY

    def unavailable_reason(self) -> str:
        """Why a request cannot be served now, in a sentence for the client."""
        if self.state is EngineState.LOADING:
            return f"The {self.noun} is still loading; try again shortly."
        if self.state is EngineState.STOPPED:
            return "The server is shutting down."
        if self.state is EngineState.SLEEPING:
            if self.error is not None:
                return f"The {self.noun} could not be loaded again after sleeping: {self.error}"
            return f"The {self.noun} is asleep; the next request wakes it."
        if self.restartable:
            wait = self.restart_in()
            again = ("the next request starts it again" if wait <= 0 else
                     f"it starts again on a request after {math.ceil(wait)} s (it stopped "
                     f"{len(self._crashes)} times in {CRASH_WINDOW_S / 60:.0f} minutes)")
            return f"The {self.load_noun} stopped: {self.error}; {again}."
        return f"The {self.load_noun} failed: {self.error}"

    # -- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._load()
        except BaseException as exc:
            failure = LoadFailure.of(exc)
            self.load_failure, self.error, self.state = failure, failure.reason, EngineState.DEAD
            self._ready.set()
            waking = self._waking is not None
            report_load_failure(failure, self.load_noun + (" again after sleep" if waking else ""),
                                None if waking else self.on_load_failure)
            return
        self.state = EngineState.READY
        self._ready.set()
        self._serve()
        if self.state is EngineState.SLEEPING:
            self._free()
            release_freed_memory()
            logger.info("The %s is asleep: freed until the next request", self.noun)
            return
        if self.state is not EngineState.DEAD:
            self.state = EngineState.STOPPED
        self._after_stop()
        if self.state is EngineState.DEAD:  # crashed: freed until a request restarts it
            self._free()
