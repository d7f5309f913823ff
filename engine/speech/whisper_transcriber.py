"""A Whisper-family model (WhisperForConditionalGeneration and its WhisperProcessor, from
the model's directory) transcribing 30 s windows of 16 kHz audio in batches.

Long recordings are cut into fixed 30 s windows (Whisper's receptive field), each decoded
on its own; a segment's times are offset by its window's start. Each batch is one call of
transformers' Whisper generate on windows that share their options (language, task,
prompt, temperature, timestamps), so a window's tokens are exactly what that generate gives
for it alone (tests/engine/test_whisper_transcriber.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from officellm.engine.speech.audio_decoding import SAMPLE_RATE

logger = logging.getLogger("officellm.transcriber")

WINDOW_SECONDS = 30.0
WINDOW_SAMPLES = int(WINDOW_SECONDS * SAMPLE_RATE)
TIME_PRECISION = 0.02  # seconds per timestamp token
TASKS = ("transcribe", "translate")


@dataclass(frozen=True)
class TranscriptionOptions:
    """What a request asks of every window: `language` a Whisper code (None: detected per
    window), `task` transcribe or translate (to English), `prompt` text the model continues
    from (its prompt_ids), `temperature` 0 for greedy else sampling, `timestamps` whether
    segments carry times (Whisper's timestamp tokens). Windows batch together only with
    windows of equal options."""

    language: str | None = None
    task: str = "transcribe"
    prompt: str | None = None
    temperature: float = 0.0
    timestamps: bool = False


@dataclass(frozen=True)
class Segment:
    """A stretch of speech: seconds from the recording's start, its text and token ids."""

    start: float
    end: float
    text: str
    tokens: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class WindowTranscript:
    """One 30 s window's result: all generated ids (the forced prefix included, as
    generate returns them), the text, its segments (times offset by the window's start) and
    the language the model was told or detected."""

    index: int
    tokens: list[int]
    text: str
    segments: list[Segment]
    language: str | None


@dataclass(frozen=True)
class TranscriberInfo:
    """What the routes need to know of a loaded model: its languages (codes) and whether
    it translates (multilingual models do)."""

    languages: tuple[str, ...]
    multilingual: bool


def cut_windows(audio: np.ndarray) -> list[np.ndarray]:
    """`audio` in consecutive 30 s windows (the last one shorter; the feature extractor
    pads it with silence)."""
    return [audio[i:i + WINDOW_SAMPLES] for i in range(0, max(audio.size, 1), WINDOW_SAMPLES)]


class WhisperTranscriber:
    """A Whisper model and processor loaded from `model_dir` (float32 on `device`)."""

    def __init__(self, model_dir: str | Path, device: str = "cpu",
                 max_new_tokens: int | None = None) -> None:
        # max_new_tokens: a cap per window below the model's own (448 positions); None: the
        # model's.
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        path = Path(model_dir)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"Transcription model {path} not found: give a Whisper "
                                    "model's Hugging Face directory (config.json, weights, "
                                    "the processor's files).")
        self.model_dir = path
        self.device = device
        self.max_new_tokens = max_new_tokens
        self.processor = WhisperProcessor.from_pretrained(str(path))
        self.model = WhisperForConditionalGeneration.from_pretrained(
            str(path), dtype=torch.float32).to(device).eval()
        generation = self.model.generation_config
        self._lang_by_id = {i: t.strip("<|>") for t, i in
                            (getattr(generation, "lang_to_id", None) or {}).items()}
        self.info = TranscriberInfo(tuple(self._lang_by_id.values()),
                                    bool(getattr(generation, "is_multilingual", False)))
        self._timestamp_begin = generation.no_timestamps_token_id + 1
        self._eot = generation.eos_token_id

    def close(self) -> None:
        """Nothing outlives the object (kept for the lifecycle's symmetry)."""

    def features(self, windows: list[np.ndarray]) -> torch.Tensor:
        """The log-mel features of `windows` (each padded to 30 s), batched."""
        return self.processor.feature_extractor(
            windows, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features

    def generate(self, windows: list[np.ndarray], options: TranscriptionOptions
                 ) -> list[list[int]]:
        """Each window's generated ids (forced prefix included, padding dropped): one
        Whisper generate call for the batch."""
        features = self.features(windows).to(self.device)
        kwargs: dict = {}
        if options.prompt:
            kwargs["prompt_ids"] = self.processor.get_prompt_ids(
                options.prompt, return_tensors="pt").to(self.device)
        if options.temperature > 0:
            kwargs.update(do_sample=True, temperature=options.temperature)
        else:
            kwargs.update(do_sample=False)
        if self.max_new_tokens is not None:
            kwargs["max_new_tokens"] = self.max_new_tokens
        with torch.inference_mode():
            out = self.model.generate(
                features, language=options.language, task=options.task,
                return_timestamps=options.timestamps, force_unique_generate_call=True,
                return_dict_in_generate=True, **kwargs)
        return [_strip_padding(row.tolist(), self._eot) for row in out.sequences]

    def transcribe(self, windows: list[np.ndarray], first_index: list[int],
                   options: TranscriptionOptions) -> list[WindowTranscript]:
        """Each window's transcript; `first_index[i]` is window i's place in its
        recording (its times start at that many 30 s)."""
        rows = self.generate(windows, options)
        return [self._read(row, index, options) for row, index in zip(rows, first_index,
                                                                      strict=True)]

    # -- reading the ids -----------------------------------------------------------------
    def _read(self, row: list[int], index: int, options: TranscriptionOptions
              ) -> WindowTranscript:
        tokenizer = self.processor.tokenizer
        language = next((self._lang_by_id[t] for t in row if t in self._lang_by_id), None)
        body = self._body(row)
        offset = index * WINDOW_SECONDS
        segments = (self._timed_segments(body, offset) if options.timestamps else [])
        text_ids = [t for t in body if t < self._timestamp_begin and t != self._eot]
        text = tokenizer.decode(text_ids, skip_special_tokens=True)
        if not segments and text.strip():
            # No timestamps asked (or none given): the window is one segment.
            end = offset + WINDOW_SECONDS
            segments = [Segment(offset, end, text, text_ids)]
        return WindowTranscript(index, row, text, segments, language)

    def _body(self, row: list[int]) -> list[int]:
        """The generated ids after the forced prefix (start of transcript, language, task,
        no-timestamps) and any prompt before it."""
        generation = self.model.generation_config
        sot = generation.decoder_start_token_id
        start = row.index(sot) + 1 if sot in row else 0
        forced = set(self._lang_by_id) | set(
            (getattr(generation, "task_to_id", None) or {}).values())
        forced.add(generation.no_timestamps_token_id)
        while start < len(row) and row[start] in forced:
            start += 1
        return row[start:]

    def _timed_segments(self, body: list[int], offset: float) -> list[Segment]:
        """Segments between pairs of timestamp tokens (<|t0|> text <|t1|>), as Whisper
        writes them; a trailing text without its closing time ends at the window's end."""
        tokenizer = self.processor.tokenizer
        segments: list[Segment] = []
        start: float | None = None
        text_ids: list[int] = []
        for token in body:
            if token == self._eot:
                break
            if token >= self._timestamp_begin:
                time = (token - self._timestamp_begin) * TIME_PRECISION
                if start is None:
                    start = time
                elif text_ids:
                    segments.append(Segment(offset + start, offset + time,
                                            tokenizer.decode(text_ids,
                                                             skip_special_tokens=True),
                                            text_ids))
                    start, text_ids = None, []
                else:
                    start = time  # two in a row: the second opens the next segment
            else:
                text_ids.append(token)
        if text_ids:
            segments.append(Segment(offset + (start or 0.0), offset + WINDOW_SECONDS,
                                    tokenizer.decode(text_ids, skip_special_tokens=True),
                                    text_ids))
        return segments


def _strip_padding(row: list[int], eot: int) -> list[int]:
    """`row` up to and including its first end of text (batch padding repeats it)."""
    return row[:row.index(eot) + 1] if eot in row else row
