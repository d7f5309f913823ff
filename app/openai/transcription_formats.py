"""A transcript in OpenAI's response formats: json ({"text"}), text, srt, vtt and
verbose_json (language, duration, segments), and the stream's events
(transcript.text.delta / transcript.text.done)."""

from __future__ import annotations

import json
import zlib
from typing import Any

from officellm.engine import Segment

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
# The formats that carry times: the model is asked for its timestamp tokens.
TIMED_FORMATS = ("srt", "vtt", "verbose_json")


def _clock(seconds: float, decimal: str) -> str:
    ms = round(seconds * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{decimal}{ms:03d}"


def srt(segments: list[Segment]) -> str:
    """SubRip: numbered cues, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, a blank line after each."""
    return "".join(f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n\n"
                   for i, s in enumerate(segments, start=1))


def vtt(segments: list[Segment]) -> str:
    """WebVTT: the header, then cues `HH:MM:SS.mmm --> HH:MM:SS.mmm`."""
    return "WEBVTT\n\n" + "".join(
        f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n\n"
        for s in segments)


def language_name(code: str | None) -> str | None:
    """Whisper's name of a language code ("en" -> "english"), as OpenAI's verbose_json
    says it; the code itself if Whisper names it otherwise."""
    # Here, not at the top: the server imports this module at start, transformers' Whisper
    # tokenizer module only when a transcript is written.
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return None if code is None else LANGUAGES.get(code, code)


def _compression_ratio(text: str) -> float:
    raw = text.encode()
    return len(raw) / len(zlib.compress(raw)) if raw else 0.0


def verbose_json(task: str, language: str | None, duration: float, text: str,
                 segments: list[Segment], temperature: float) -> dict[str, Any]:
    """OpenAI's verbose_json: the text, the language, the audio's duration and each segment
    (its window's start as `seek`, in 10 ms frames as Whisper counts them). The log
    probabilities Whisper's reference computes are not, so they are null."""
    return {
        "task": task, "language": language_name(language), "duration": round(duration, 3),
        "text": text,
        "segments": [{"id": i, "seek": int(s.start // 30) * 3000, "start": round(s.start, 2),
                      "end": round(s.end, 2), "text": s.text, "tokens": s.tokens,
                      "temperature": temperature, "avg_logprob": None,
                      "compression_ratio": _compression_ratio(s.text), "no_speech_prob": None}
                     for i, s in enumerate(segments)],
        "usage": duration_usage(duration),
    }


def duration_usage(duration: float) -> dict[str, Any]:
    """OpenAI's usage of a transcription billed by duration."""
    return {"type": "duration", "seconds": round(duration, 3)}


def delta_event(delta: str) -> str:
    """A stream's `transcript.text.delta` event (the text of the next window)."""
    return "data: " + json.dumps({"type": "transcript.text.delta", "delta": delta,
                                  "logprobs": None}) + "\n\n"


def done_event(text: str, duration: float) -> str:
    """A stream's closing `transcript.text.done` event: the whole text and the usage."""
    return "data: " + json.dumps({"type": "transcript.text.done", "text": text,
                                  "logprobs": None, "usage": duration_usage(duration)}) + "\n\n"
