"""AsyncTranscriber: a Whisper-family model on its own thread, fed from asyncio.

A recording is cut into 30 s windows; the thread takes what is waiting, across requests,
and runs up to MAX_BATCH_WINDOWS windows that share their options in one generate call, so
ten people's meeting recordings cost about one pass per window position, not ten. Like
AsyncEmbedder it loads the model on that thread, blocks when idle (no CPU) and sleeps when
idle (ModelLifecycle)."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np

from officellm.engine.model_lifecycle import (
    EngineDeadError,
    EngineState,
    LoadFailure,
    ModelLifecycle,
)
from officellm.engine.speech.audio_decoding import SAMPLE_RATE
from officellm.engine.speech.whisper_transcriber import (
    TranscriberInfo,
    TranscriptionOptions,
    WhisperTranscriber,
    WindowTranscript,
    cut_windows,
)

logger = logging.getLogger("officellm.transcriber")

MAX_BATCH_WINDOWS = 16


@dataclass
class TranscriberStats:
    """Totals since start: requests, windows decoded, seconds of audio, generate calls."""

    requests: int = 0
    windows: int = 0
    audio_seconds: float = 0.0
    batches: int = 0


@dataclass
class _Window:
    samples: np.ndarray
    index: int
    options: TranscriptionOptions
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class _Stop:
    pass


class _Sleep:
    pass


class AsyncTranscriber(ModelLifecycle):
    """Runs the transcriber `factory` builds on a dedicated thread."""

    noun = "transcription model"
    load_noun = "transcription model"
    thread_name = "transcriber"

    def __init__(self, factory: Callable[[], WhisperTranscriber],
                 on_load_failure: Callable[[LoadFailure], None] | None = None) -> None:
        super().__init__(on_load_failure)
        self._factory = factory
        self._windows: queue.SimpleQueue[_Window | _Stop | _Sleep] = queue.SimpleQueue()
        self.transcriber: WhisperTranscriber | None = None
        self._stats = TranscriberStats()
        self._stats_lock = threading.Lock()
        self.leases = 0  # requests between their wake and their last window (event loop)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, asleep: bool = False) -> None:
        """Start the thread, which loads the model and then transcribes what comes;
        `asleep`: load nothing until the first wake()."""
        if self._thread is not None or self.state is EngineState.SLEEPING:
            return
        if asleep:
            self.state = EngineState.SLEEPING
            return
        self._start_thread()

    def sleep(self) -> bool:
        """Free the model (its thread ends) if no request is using it; True if it went to
        sleep. wake() loads it again."""
        if self.state is not EngineState.READY or self.leases:
            return False
        self.state = EngineState.SLEEPING
        self._windows.put(_Sleep())
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the windows already queued."""
        if self._thread is not None:
            self._windows.put(_Stop())
            self._thread.join(timeout)

    @property
    def info(self) -> TranscriberInfo:
        """Its languages; EngineDeadError if it is not loaded."""
        transcriber = self.transcriber
        if transcriber is None:
            raise EngineDeadError(self.unavailable_reason())
        return transcriber.info

    def stats(self) -> TranscriberStats:
        with self._stats_lock:
            return TranscriberStats(**vars(self._stats))

    # -- requests (event loop side) ------------------------------------------------------
    async def transcribe(self, audio: np.ndarray, options: TranscriptionOptions
                         ) -> AsyncIterator[WindowTranscript]:
        """Each 30 s window's transcript, in order, as soon as it and those before it are
        done; the windows are batched with whatever else waits. EngineDeadError if the
        model is not available."""
        if not self.is_ready:
            raise EngineDeadError(self.unavailable_reason())
        loop = asyncio.get_running_loop()
        windows = cut_windows(audio)
        futures = [loop.create_future() for _ in windows]
        for index, (samples, future) in enumerate(zip(windows, futures, strict=True)):
            self._windows.put(_Window(samples, index, options, future, loop))
        with self._stats_lock:
            self._stats.requests += 1
            self._stats.audio_seconds += audio.size / SAMPLE_RATE
        try:
            for future in futures:
                yield await future
        finally:
            for future in futures:  # the client left: its windows not begun are skipped
                future.cancel()

    # -- the thread (ModelLifecycle's) ---------------------------------------------------
    def _load(self) -> None:
        self.transcriber = self._factory()

    def _serve(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._run_batch(batch)

    def _free(self) -> None:
        if self.transcriber is not None:
            self.transcriber.close()
        self.transcriber = None

    def _after_stop(self) -> None:
        while True:
            try:
                item = self._windows.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Window):
                _settle(item, exception=EngineDeadError(self.unavailable_reason()))

    def _next_batch(self) -> list[_Window] | None:
        """The first waiting window (blocking), then the others waiting with its options,
        up to MAX_BATCH_WINDOWS; None once stopped or asleep. Windows of other options
        wait for a later batch, in their order."""
        first = self._windows.get()
        if isinstance(first, (_Stop, _Sleep)):
            return None
        batch, later = [first], []
        while len(batch) < MAX_BATCH_WINDOWS:
            try:
                item = self._windows.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, (_Stop, _Sleep)):
                later.append(item)
                break
            (batch if item.options == first.options else later).append(item)
        for item in later:
            self._windows.put(item)
        return batch

    def _run_batch(self, batch: list[_Window]) -> None:
        live = [w for w in batch if not w.future.done()]  # cancelled: its client left
        if not live:
            return
        assert self.transcriber is not None
        try:
            results = self.transcriber.transcribe([w.samples for w in live],
                                                  [w.index for w in live], live[0].options)
        except Exception as exc:  # this batch fails; the next one is tried afresh
            logger.exception("Transcribing a batch of %d windows failed", len(live))
            for window in live:
                _settle(window, exception=RuntimeError(f"Transcription failed: {exc}"))
            return
        with self._stats_lock:
            self._stats.windows += len(live)
            self._stats.batches += 1
        for window, result in zip(live, results, strict=True):
            _settle(window, result=result)


def _settle(item: _Window, result: WindowTranscript | None = None,
            exception: BaseException | None = None) -> None:
    def settle() -> None:
        if item.future.done():  # its request was cancelled (the client left)
            return
        if exception is not None:
            item.future.set_exception(exception)
        else:
            item.future.set_result(result)

    try:
        item.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the event loop has closed: nobody waits
        pass
