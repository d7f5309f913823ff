"""POST /v1/audio/transcriptions and /v1/audio/translations through the real `openai`
client, on the real app in this process serving a tiny random Whisper
(benchmarks/random_whisper.py) registered as a transcribe model: a sentence espeak-ng
speaks into a WAV comes back in every response format as the transcriber itself writes it,
streamed too; a 30-minute recording is cut into 30 s windows and answered; bad audio and a
model of another kind are 400s; the audio's seconds are counted in the usage and held to
the policy's audio_minutes_per_day."""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import av
import httpx
import numpy as np
import openai
import pytest

from benchmarks.random_whisper import build_tiny_whisper
from officellm.app.server import create_app
from officellm.app.server_settings import ServerSettings
from officellm.engine import (
    SAMPLE_RATE,
    AsyncTranscriber,
    TranscriptionOptions,
    WhisperTranscriber,
    decode_audio,
)
from tests.support.app_in_thread import app_in_thread

KEY = "sk-audio-test"
RECORDED = Path(__file__).parent / "recorded"
MODEL = "whisper-tiny"  # the name Open WebUI was set to send (tests/server/recorded/)
CHAT_MODEL = "chat-model"  # a generate model (never loaded: only its kind matters)
MAX_NEW_TOKENS = 8  # a random model never ends its window: keep each short
SENTENCE = "The quarterly budget meeting moves to Thursday at ten."


def _never_loads():
    raise RuntimeError("no chat model in these tests")


@dataclass
class Served:
    url: str
    client: openai.OpenAI
    transcriber: AsyncTranscriber
    whisper_dir: Path
    admin_token: str


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real recording: espeak-ng speaking SENTENCE (22 kHz mono WAV)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng; "
                    "installer/install.sh --dev installs it)")
    out = tmp_path_factory.mktemp("speech") / "sentence.wav"
    subprocess.run(["espeak-ng", "-w", str(out), SENTENCE], check=True, timeout=60)
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("audio_app")
    whisper_dir = build_tiny_whisper(tmp / "whisper", d_model=32, layers=1,
                                     max_new_tokens=MAX_NEW_TOKENS)
    app = create_app(ServerSettings(api_keys=[KEY], database=str(tmp / "officellm.db"),
                                    engine_in_process=True), _never_loads)
    with app_in_thread(app) as url:
        token = (tmp / "admin_token").read_text().strip()
        for name, source, kind in ((MODEL, whisper_dir, "transcribe"),
                                   (CHAT_MODEL, tmp, "generate")):
            r = httpx.post(f"{url}/admin/models", headers={"Authorization": f"Bearer {token}"},
                           json={"name": name, "source": str(source), "kind": kind},
                           timeout=60)
            assert r.status_code in (200, 201), r.text
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0,
                               timeout=300)
        with pytest.raises(openai.BadRequestError):  # the registry read: the model is served
            client.audio.transcriptions.create(model=MODEL, file=("x.wav", b""))
        spoken = app.state.server.models.find_transcriber(MODEL)
        yield Served(url, client, spoken.transcriber, whisper_dir, token)


@pytest.fixture(scope="module")
def reference(served: Served) -> WhisperTranscriber:
    """The same model, run directly (not through the server)."""
    return WhisperTranscriber(served.whisper_dir)


def _direct_text(reference: WhisperTranscriber, wav: Path, **options) -> str:
    audio = decode_audio(wav.read_bytes())
    windows = [audio[i:i + 30 * SAMPLE_RATE] for i in range(0, audio.size, 30 * SAMPLE_RATE)]
    results = reference.transcribe(windows, list(range(len(windows))),
                                   TranscriptionOptions(**options))
    return "".join(w.text for w in results).strip()


def test_json_is_the_transcribers_own_text(served, speech_wav, reference):
    with speech_wav.open("rb") as f:
        got = served.client.audio.transcriptions.create(model=MODEL, file=f, language="en")
    assert got.text == _direct_text(reference, speech_wav, language="en")
    assert got.text


def test_text_srt_and_vtt_formats(served, speech_wav, reference):
    def ask(fmt: str) -> str:
        with speech_wav.open("rb") as f:
            return served.client.audio.transcriptions.create(
                model=MODEL, file=f, language="en", response_format=fmt)

    assert ask("text").strip() == _direct_text(reference, speech_wav, language="en")
    timed = _direct_text(reference, speech_wav, language="en", timestamps=True)
    srt, vtt = ask("srt"), ask("vtt")
    assert srt.startswith("1\n00:00:") and " --> " in srt
    assert vtt.startswith("WEBVTT\n\n00:00:")
    cues = [block.split("\n", 2)[2] for block in srt.strip().split("\n\n")]
    assert "".join(cues).replace(" ", "") == timed.replace(" ", "")


def test_verbose_json_has_language_duration_and_timed_segments(served, speech_wav):
    seconds = decode_audio(speech_wav.read_bytes()).size / SAMPLE_RATE
    with speech_wav.open("rb") as f:
        got = served.client.audio.transcriptions.create(
            model=MODEL, file=f, language="en", response_format="verbose_json",
            timestamp_granularities=["segment"])
    assert got.language == "english" and got.duration == pytest.approx(seconds, abs=1e-3)
    assert got.segments and all(0 <= s.start <= s.end <= 30 for s in got.segments)
    assert "".join(s.text for s in got.segments).strip() == got.text


def test_translation_is_whispers_translate_task(served, speech_wav, reference):
    with speech_wav.open("rb") as f:
        got = served.client.audio.translations.create(model=MODEL, file=f)
    assert got.text == _direct_text(reference, speech_wav, task="translate")


def test_stream_sends_text_deltas_then_done(served, speech_wav, reference):
    with speech_wav.open("rb") as f:
        events = list(served.client.audio.transcriptions.create(
            model=MODEL, file=f, language="en", stream=True))
    assert [e.type for e in events][-1] == "transcript.text.done"
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert deltas and "".join(deltas).strip() == events[-1].text
    assert events[-1].text == _direct_text(reference, speech_wav, language="en")


def test_word_timestamps_are_refused_saying_so(served, speech_wav):
    with speech_wav.open("rb") as f, pytest.raises(openai.BadRequestError, match="Word-level"):
        served.client.audio.transcriptions.create(
            model=MODEL, file=f, response_format="verbose_json",
            timestamp_granularities=["word"])


def _thirty_minutes_flac(speech: np.ndarray) -> bytes:
    """30 minutes at 16 kHz mono: the sentence at the start of every minute, silence between,
    FLAC-compressed (about a megabyte)."""
    minute = np.zeros(60 * SAMPLE_RATE, np.float32)
    minute[:speech.size] = speech[:minute.size]
    buf = io.BytesIO()
    _write_flac(buf, np.tile(minute, 30))
    return buf.getvalue()


def _write_flac(buf: io.BytesIO, audio: np.ndarray) -> None:
    with av.open(buf, "w", format="flac") as out:
        stream = out.add_stream("flac", rate=SAMPLE_RATE, layout="mono")
        pcm = (audio * 32767).astype(np.int16)
        for i in range(0, pcm.size, 65536):
            frame = av.AudioFrame.from_ndarray(pcm[None, i:i + 65536], format="s16",
                                               layout="mono")
            frame.sample_rate = SAMPLE_RATE
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def test_a_thirty_minute_recording_is_cut_into_sixty_windows(served, speech_wav):
    flac = _thirty_minutes_flac(decode_audio(speech_wav.read_bytes()))
    before = served.transcriber.stats()
    got = served.client.audio.transcriptions.create(
        model=MODEL, file=("meeting.flac", flac), language="en", response_format="verbose_json")
    after = served.transcriber.stats()
    assert after.windows - before.windows == 60
    assert after.batches - before.batches < 60  # windows ran together
    assert got.duration == pytest.approx(1800, abs=0.1)
    assert max(s.end for s in got.segments) > 1770


@pytest.mark.parametrize("data", [b"", b"this is not audio at all", b"RIFF\x24\x00\x00\x00WAVE"],
                         ids=["empty", "not-audio", "truncated"])
def test_bad_audio_is_a_400_in_openais_shape(served, data):
    r = httpx.post(f"{served.url}/v1/audio/transcriptions",
                   headers={"Authorization": f"Bearer {KEY}"},
                   files={"file": ("x.wav", data)}, data={"model": MODEL}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "file" and r.json()["error"]["message"]


def test_a_model_that_does_not_transcribe_is_refused(served, speech_wav):
    with speech_wav.open("rb") as f, pytest.raises(openai.NotFoundError):
        served.client.audio.transcriptions.create(model="no-such-model", file=f)
    with speech_wav.open("rb") as f, pytest.raises(openai.BadRequestError,
                                                   match="does not transcribe speech"):
        served.client.audio.transcriptions.create(model=CHAT_MODEL, file=f)


def test_the_models_tab_and_v1_models_list_it_with_its_kind(served):
    r = httpx.get(f"{served.url}/admin/models", timeout=60,
                  headers={"Authorization": f"Bearer {served.admin_token}"})
    assert r.status_code == 200, r.text
    [row] = [m for m in r.json()["models"] if m["name"] == MODEL]
    assert row["kind"] == "transcribe" and row["state"] == "ready"
    assert row["memory_bytes"] > 0  # its weights, planned in the memory budget
    assert MODEL in [m.id for m in served.client.models.list().data]


def _usage_total(served: Served) -> dict:
    r = httpx.get(f"{served.url}/admin/usage", params={"user": "key1"}, timeout=60,
                  headers={"Authorization": f"Bearer {served.admin_token}"})
    assert r.status_code == 200, r.text
    return r.json()["total"]


def test_usage_counts_the_request_and_its_audio_seconds(served, speech_wav):
    seconds = decode_audio(speech_wav.read_bytes()).size / SAMPLE_RATE
    before = _usage_total(served)
    with speech_wav.open("rb") as f:
        served.client.audio.transcriptions.create(model=MODEL, file=f, language="en")
    after = _usage_total(served)
    assert after["audio_requests"] == before["audio_requests"] + 1
    assert after["audio_seconds"] == pytest.approx(before["audio_seconds"] + seconds, abs=1e-3)
    assert after["requests"] == before["requests"] + 1


def _admin(served: Served, method: str, path: str, body: dict | None = None) -> dict:
    r = httpx.request(method, f"{served.url}/admin{path}", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {served.admin_token}"})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_policys_models_restrict_it_like_any_model(served, speech_wav):
    _admin(served, "PUT", "/policies/users/key1", {"models": [CHAT_MODEL]})
    try:
        with speech_wav.open("rb") as f, pytest.raises(openai.PermissionDeniedError,
                                                       match="does not let you use"):
            served.client.audio.transcriptions.create(model=MODEL, file=f)
    finally:
        _admin(served, "PUT", "/policies/users/key1", {"models": None})


def test_it_sleeps_when_idle_and_the_next_request_wakes_it(served, speech_wav):
    _admin(served, "PATCH", f"/models/{MODEL}", {"sleep_idle_seconds": 0.5})
    try:
        deadline = time.monotonic() + 30
        while served.transcriber.is_ready and time.monotonic() < deadline:
            time.sleep(0.2)
            served.client.models.list()  # re-reads the registry: the entry's new idle time
        [row] = [m for m in _admin(served, "GET", "/models")["models"] if m["name"] == MODEL]
        assert row["state"] == "sleeping"
        with speech_wav.open("rb") as f:
            assert served.client.audio.transcriptions.create(model=MODEL, file=f,
                                                             language="en").text
    finally:
        _admin(served, "PATCH", f"/models/{MODEL}", {"sleep_idle_seconds": 0})


def test_the_policys_audio_minutes_per_day_refuses_past_the_limit(served, speech_wav):
    _admin(served, "PUT", "/policies/users/key1", {"audio_minutes_per_day": 1})
    two_minutes = np.tile(decode_audio(speech_wav.read_bytes()), 60)[:120 * SAMPLE_RATE]
    buf = io.BytesIO()
    _write_flac(buf, two_minutes)
    try:
        with pytest.raises(openai.RateLimitError, match="minutes of audio a day"):
            served.client.audio.transcriptions.create(model=MODEL, file=("long.flac",
                                                                         buf.getvalue()))
    finally:
        _admin(served, "PUT", "/policies/users/key1", {"audio_minutes_per_day": None})


def _recorded_body(recording: dict) -> bytes:
    """The multipart bytes a recording's body_encoding describes."""
    form = recording["body"]["multipart"]
    boundary = form["boundary"].encode()
    body = b""
    for part in form["parts"]:
        head = b"".join(f"{k}: {v}\r\n".encode() for k, v in part["headers"].items())
        value = (base64.b64decode(part["base64"]) if "base64" in part
                 else part["value"].encode())
        body += b"--" + boundary + b"\r\n" + head + b"\r\n" + value + b"\r\n"
    return body + b"--" + boundary + b"--\r\n"


@pytest.mark.parametrize("name", ["open_webui_0.12.4_transcription.json",
                                  "open_webui_0.12.4_transcription_upload.json"],
                         ids=["microphone", "upload"])
def test_open_webuis_recorded_upload_is_transcribed(served, reference, name):
    """Open WebUI's speech-to-text engine `openai` (recorded): an MP3 of espeak-ng's
    sentence, only the fields model and file, the body chunked; it reads `text`."""
    recording = json.loads((RECORDED / name).read_text())
    body = _recorded_body(recording)

    def chunked():  # no content-length, as aiohttp sent it
        yield body[:4096]
        yield body[4096:]

    r = httpx.post(f"{served.url}{recording['path']}", content=chunked(), timeout=120,
                   headers={"content-type": recording["headers"]["content-type"],
                            "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text
    mp3 = next(base64.b64decode(p["base64"]) for p in recording["body"]["multipart"]["parts"]
               if p["name"] == "file")
    audio = decode_audio(mp3)
    windows = [audio[i:i + 30 * SAMPLE_RATE] for i in range(0, audio.size, 30 * SAMPLE_RATE)]
    direct = reference.transcribe(windows, list(range(len(windows))), TranscriptionOptions())
    assert r.json()["text"] == "".join(w.text for w in direct).strip()
