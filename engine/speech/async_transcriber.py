"""AsyncTranscriber: a Whisper-family model on its own thread, fed from asyncio.

A recording is cut into 30 s windows; the thread takes what is waiting, across requests,
and runs up to MAX_BATCH_WINDOWS windows that share their options in one generate call, so
ten people's meeting recordings cost about one pass per window position, not ten. Like
AsyncEmbedder it loads the model on that thread, blocks when idle (no CPU) and sleeps when
idle (engine/batching_thread.py has what they share)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np

from officellm.engine.batching_thread import BatchingThread, Joining
from officellm.engine.model_lifecycle import EngineDeadError, LoadFailure
from officellm.engine.speech.audio_decoding import SAMPLE_RATE
from officellm.engine.speech.whisper_transcriber import (
    TranscriberInfo,
    TranscriptionOptions,
    WhisperTranscriber,
    WindowTranscript,
    cut_windows,
)

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


class AsyncTranscriber(BatchingThread[_Window, TranscriberStats]):
    """Runs the transcriber `factory` builds on a dedicated thread."""

    noun = "transcription model"
    load_noun = "transcription model"
    thread_name = "transcriber"
    max_batch = MAX_BATCH_WINDOWS
    item_noun = "windows"

    def __init__(self, factory: Callable[[], WhisperTranscriber],
                 on_load_failure: Callable[[LoadFailure], None] | None = None) -> None:
        super().__init__(TranscriberStats(), on_load_failure)
        self._factory = factory
        self.transcriber: WhisperTranscriber | None = None

    @property
    def info(self) -> TranscriberInfo:
        """Its languages; EngineDeadError if it is not loaded."""
        transcriber = self.transcriber
        if transcriber is None:
            raise EngineDeadError(self.unavailable_reason())
        return transcriber.info

    # -- requests (event loop side) ------------------------------------------------------
    async def transcribe(self, audio: np.ndarray, options: TranscriptionOptions
                         ) -> AsyncIterator[WindowTranscript]:
        """Each 30 s window's transcript, in order, as soon as it and those before it are
        done; the windows are batched with whatever else waits. EngineDeadError if the
        model is not available."""
        self._check_ready()
        loop = asyncio.get_running_loop()
        windows = cut_windows(audio)
        futures = [loop.create_future() for _ in windows]
        self._submit([_Window(samples, index, options, future, loop) for index, (samples, future)
                      in enumerate(zip(windows, futures, strict=True))])
        with self._stats_lock:
            self._stats.audio_seconds += audio.size / SAMPLE_RATE
        try:
            for future in futures:
                yield await future
        finally:
            for future in futures:  # the client left: its windows not begun are skipped
                future.cancel()

    # -- the thread (BatchingThread's) ---------------------------------------------------
    def _load(self) -> None:
        self.transcriber = self._factory()

    def _free(self) -> None:
        if self.transcriber is not None:
            self.transcriber.close()
        self.transcriber = None

    def _joins(self, batch: list[_Window], item: _Window) -> Joining:
        """Windows share one generate call only with the same options; the others wait for
        a later batch, in their order."""
        return Joining.TAKEN if item.options == batch[0].options else Joining.LATER

    def _run_batch(self, batch: list[_Window]) -> bool:
        live = [w for w in batch if not w.future.done()]  # cancelled: its client left
        if not live:
            return True
        assert self.transcriber is not None
        try:
            results = self.transcriber.transcribe([w.samples for w in live],
                                                  [w.index for w in live], live[0].options)
        except Exception as exc:
            self._fail_batch(live, "Transcription", exc)
            return True
        with self._stats_lock:
            self._stats.windows += len(live)
            self._stats.batches += 1
        self._answer(live, results)
        return True
