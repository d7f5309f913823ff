"""POST /v1/audio/transcriptions and /v1/audio/translations: OpenAI's speech to text, from a
model of kind transcribe (a Whisper-family model), under the same auth, per-user
concurrency, policies and fair sharing as the other routes; the audio's seconds count in
the user's usage and against the policy's audio_minutes_per_day."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import APIRouter, Depends, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from officellm.app.admission.auth import get_caller, get_principal
from officellm.app.errors import APIError, unavailable
from officellm.app.models.served_transcriber import ServedTranscriber
from officellm.app.openai import transcription_formats as formats
from officellm.app.openai.answers import ERROR_RESPONSES
from officellm.app.policy.limits import seconds_until_utc_midnight
from officellm.app.principal import Principal
from officellm.app.serving.state import ServerState, get_server
from officellm.engine import (
    SAMPLE_RATE,
    AudioDecodeError,
    EngineDeadError,
    TranscriptionOptions,
    WindowTranscript,
    decode_audio,
)

router = APIRouter(responses=ERROR_RESPONSES)
access_log = logging.getLogger("officellm.access")


@dataclass(frozen=True)
class AudioRequest:
    """One transcription or translation request's form, checked."""

    data: bytes
    model: str | None
    options: TranscriptionOptions
    response_format: str
    stream: bool


async def _read_form(file: UploadFile, model: str | None, language: str | None,
                     prompt: str | None, response_format: str, temperature: float,
                     granularities: list[str] | None, stream: bool, task: str,
                     max_bytes: int) -> AudioRequest:
    """The form's fields checked as OpenAI checks them (400 naming the field)."""
    if response_format not in formats.FORMATS:
        raise APIError(400, f"response_format must be one of {', '.join(formats.FORMATS)}, "
                       f"not {response_format!r}.", param="response_format")
    if not 0.0 <= temperature <= 1.0:
        raise APIError(400, f"temperature must be between 0 and 1, not {temperature}.",
                       param="temperature")
    granularities = granularities or []
    unknown = set(granularities) - {"segment", "word"}
    if unknown:
        raise APIError(400, f"timestamp_granularities may hold segment and word, not "
                       f"{', '.join(sorted(unknown))}.", param="timestamp_granularities")
    if "word" in granularities:
        raise APIError(400, "Word-level timestamps are not supported by this server; ask for "
                       "timestamp_granularities=[\"segment\"] (verbose_json's segments).",
                       param="timestamp_granularities")
    if granularities and response_format != "verbose_json":
        raise APIError(400, "timestamp_granularities needs response_format verbose_json.",
                       param="timestamp_granularities")
    data = await file.read()
    if len(data) > max_bytes:
        raise APIError(413, f"The audio file is {len(data):,} bytes, over this server's limit "
                       f"of {max_bytes:,} (--audio-max-bytes).", param="file",
                       code="request_too_large")
    options = TranscriptionOptions(
        language=(language or None), task=task, prompt=prompt or None,
        temperature=temperature, timestamps=response_format in formats.TIMED_FORMATS)
    return AudioRequest(data, model or None, options, response_format, stream)


def _check_model_options(served: ServedTranscriber, options: TranscriptionOptions) -> None:
    """400 for a language the model does not know, or a translation by an English-only
    model."""
    info = served.transcriber.info
    if options.language is not None and options.language not in info.languages:
        known = ", ".join(info.languages) or "none (it is English-only: leave language out)"
        raise APIError(400, f"The model `{served.name}` does not know the language "
                       f"{options.language!r}; it knows: {known}.", param="language")
    if options.task == "translate" and not info.multilingual:
        raise APIError(400, f"The model `{served.name}` is English-only: it cannot translate.",
                       param="model")


def _check_audio_minutes(server: ServerState, principal: Principal, seconds: float) -> None:
    """429 once the user's audio today, with this recording, passes the policy's
    audio_minutes_per_day."""
    used, limit = server.accounts.audio_today(principal.user_id)
    if limit is None:
        return
    if used + seconds > limit * 60:
        left = max(0.0, limit * 60 - used)
        raise APIError(429, f"This recording is {seconds / 60:.1f} minutes, and your policy "
                       f"allows {limit:g} minutes of audio a day ({left / 60:.1f} left today). "
                       "Try again tomorrow (UTC) or ask your administrator.",
                       code="insufficient_quota",
                       headers={"Retry-After": str(seconds_until_utc_midnight())})


async def _serve(request: Request, principal: Principal, server: ServerState,
                 form: AudioRequest, endpoint: str) -> Response:
    principal = await get_caller(request, principal, None)
    served = await server.models.resolve_transcriber(form.model)
    name, transcriber = served.name, served.transcriber
    server.admission.refuse_if_draining()
    t0 = time.monotonic()
    seconds = 0.0

    def record(windows: list[WindowTranscript]) -> None:
        busy = time.monotonic() - t0
        tokens = sum(len(s.tokens) for w in windows for s in w.segments)
        server.accounts.record_transcription(principal.user_id, name, seconds, tokens, busy)
        server.metrics.record_transcription(name, principal.user, seconds, len(windows))
        access_log.info("audio-%s user=%s %s status=200 audio_seconds=%.1f windows=%d "
                        "duration=%.3fs", uuid.uuid4().hex[:12], principal.user, endpoint,
                        seconds, len(windows), busy)

    def release() -> None:
        transcriber.leases -= 1
        served.touch()

    async with server.admission.admit(principal, endpoint, 0, name) as admission:
        # Leased from its load to its last window (a stream's too: the lease ends with the
        # admission): idle sleep never frees it in between.
        transcriber.leases += 1
        admission.on_release(release)
        # Decoded once admitted: a long file's decoding is the user's work like its windows.
        try:
            audio = await run_in_threadpool(decode_audio, form.data,
                                            server.settings.audio_max_seconds)
        except AudioDecodeError as exc:
            raise APIError(400, str(exc), param="file") from exc
        seconds = audio.size / SAMPLE_RATE
        await run_in_threadpool(_check_audio_minutes, server, principal, seconds)
        try:
            await server.models.load_transcriber(served)
            _check_model_options(served, form.options)
            windows_out = transcriber.transcribe(audio, form.options)
            if form.stream:
                return admission.hold(StreamingResponse(_stream(windows_out, seconds, record),
                                                        media_type="text/event-stream"))
            windows = [window async for window in windows_out]
        except EngineDeadError as exc:
            raise unavailable(str(exc), server.settings.retry_after_s) from exc
    record(windows)
    return _answer(form, windows, seconds)


async def _stream(windows_out: AsyncIterator[WindowTranscript], seconds: float,
                  record: Callable[[list[WindowTranscript]], None]) -> AsyncIterator[str]:
    """transcript.text.delta per window as it is done, then transcript.text.done."""
    windows: list[WindowTranscript] = []
    async for window in windows_out:
        windows.append(window)
        if window.text:
            yield formats.delta_event(window.text)
    record(windows)
    yield formats.done_event("".join(w.text for w in windows).strip(), seconds)


def _answer(form: AudioRequest, windows: list[WindowTranscript], seconds: float) -> Response:
    text = "".join(w.text for w in windows).strip()
    segments = [s for w in windows for s in w.segments]
    kind = form.response_format
    if kind == "text":
        return PlainTextResponse(text + "\n")
    if kind == "srt":
        return PlainTextResponse(formats.srt(segments))
    if kind == "vtt":
        return PlainTextResponse(formats.vtt(segments), media_type="text/vtt")
    if kind == "verbose_json":
        language = form.options.language or next((w.language for w in windows if w.language),
                                                 None)
        return JSONResponse(formats.verbose_json(form.options.task, language, seconds, text,
                                                 segments, form.options.temperature))
    return JSONResponse({"text": text, "usage": formats.duration_usage(seconds)})


@router.post("/v1/audio/transcriptions")
async def transcriptions(
        request: Request,
        file: UploadFile = File(...),  # noqa: B008 - FastAPI's form declarations
        model: str | None = Form(None),
        language: str | None = Form(None),
        prompt: str | None = Form(None),
        response_format: str = Form("json"),
        temperature: float = Form(0.0),
        timestamp_granularities: list[str] | None = Form(None,  # noqa: B008
                                                         alias="timestamp_granularities[]"),
        stream: bool = Form(False),
        principal: Principal = Depends(get_principal),
        server: ServerState = Depends(get_server)) -> Response:
    """The recording's text in its own language (or `language`, a Whisper code), in
    `response_format`; `stream`: SSE events per 30 s window."""
    form = await _read_form(file, model, language, prompt, response_format, temperature,
                            timestamp_granularities, stream, "transcribe",
                            server.settings.audio_max_bytes)
    return await _serve(request, principal, server, form, "audio.transcriptions")


@router.post("/v1/audio/translations")
async def translations(
        request: Request,
        file: UploadFile = File(...),  # noqa: B008
        model: str | None = Form(None),
        prompt: str | None = Form(None),
        response_format: str = Form("json"),
        temperature: float = Form(0.0),
        principal: Principal = Depends(get_principal),
        server: ServerState = Depends(get_server)) -> Response:
    """The recording's speech translated into English text, in `response_format`."""
    form = await _read_form(file, model, None, prompt, response_format, temperature, None,
                            False, "translate", server.settings.audio_max_bytes)
    return await _serve(request, principal, server, form, "audio.translations")
