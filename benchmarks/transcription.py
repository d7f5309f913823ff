"""Speech to text on the CPU: real-time factor (seconds of work per second of audio, lower is
better) of transformers' pipeline("automatic-speech-recognition") against officellm's
transcriber and its /v1/audio/transcriptions route, in one run on one machine, on one
random-weight Whisper of whisper-tiny's shape (d_model 384, 4 + 4 layers, 6 heads, a 51,865
token vocabulary; random weights: no download).

The recording is espeak-ng speaking a sentence at the start of every 10 s (silence
between), --minutes long (noise if espeak-ng is missing). A random model never ends its
window, so each window is capped at --window-tokens new tokens (about what 30 s of speech
takes) for every run alike. Measured:

  pipeline             transformers' pipeline, chunk_length_s=30, batch_size=--batch, greedy
                       (num_beams=1: its default for Whisper is a 5-beam search)
  transcriber          officellm's WhisperTranscriber: 30 s windows, --batch per generate
  route, 1 client      one POST /v1/audio/transcriptions of the whole recording
  route, 4 clients     four clients at once, each a quarter of the recording: the server
                       batches their windows together

Writes benchmarks/results/transcription.json (the machine, the settings, each run's seconds
and real-time factor) and .png.

    .venv/bin/python benchmarks/transcription.py [--threads 2] [--minutes 5]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import cpu_description  # noqa: E402
from officellm.engine import (  # noqa: E402
    SAMPLE_RATE,
    TranscriptionOptions,
    WhisperTranscriber,
    decode_audio,
)

RESULTS = REPO / "benchmarks" / "results"
KEY = "bench"


def recording(minutes: float, tmp: Path) -> tuple[np.ndarray, str]:
    """--minutes of 16 kHz audio: espeak-ng's sentence every 10 s, or noise without it."""
    total = int(minutes * 60 * SAMPLE_RATE)
    if shutil.which("espeak-ng"):
        wav = tmp / "sentence.wav"
        subprocess.run(["espeak-ng", "-w", str(wav), "The quarterly budget meeting moves to "
                        "Thursday at ten; bring the printed figures."], check=True)
        speech = decode_audio(wav.read_bytes())
        block = np.zeros(10 * SAMPLE_RATE, np.float32)
        block[:min(speech.size, block.size)] = speech[:block.size]
        return np.tile(block, total // block.size + 1)[:total], "espeak-ng"
    rng = np.random.default_rng(0)
    return (0.1 * rng.standard_normal(total)).astype(np.float32), "noise"


def wav_bytes(audio: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype(np.int16).tobytes())
    return buf.getvalue()


def best_of(repeats: int, run) -> float:
    """The fastest of `repeats` timed calls of `run` (a shared machine's other work only
    ever slows a run down)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


def through_pipeline(model_dir: Path, audio: np.ndarray, batch: int, repeats: int) -> float:
    """transformers' ASR pipeline on the whole recording, seconds (after a warm-up)."""
    from transformers import pipeline

    asr = pipeline("automatic-speech-recognition", model=str(model_dir), device="cpu")
    # Greedy, as officellm decodes at temperature 0: the pipeline's own default for Whisper
    # is a 5-beam search (about 50 times the work on this model; not what is compared).
    kwargs = dict(chunk_length_s=30, batch_size=batch,
                  generate_kwargs={"language": "en", "task": "transcribe", "num_beams": 1})
    asr(audio[:SAMPLE_RATE * 5].copy(), **kwargs)
    return best_of(repeats, lambda: asr(audio.copy(), **kwargs))


def through_transcriber(model_dir: Path, audio: np.ndarray, batch: int, repeats: int
                        ) -> float:
    """officellm's WhisperTranscriber on the recording's 30 s windows, --batch a call."""
    transcriber = WhisperTranscriber(model_dir)
    options = TranscriptionOptions(language="en")
    step = 30 * SAMPLE_RATE
    windows = [audio[i:i + step] for i in range(0, audio.size, step)]
    transcriber.transcribe(windows[:1], [0], options)

    def run() -> None:
        for i in range(0, len(windows), batch):
            part = windows[i:i + batch]
            transcriber.transcribe(part, list(range(i, i + len(part))), options)

    return best_of(repeats, run)


def through_route(model_dir: Path, audio: np.ndarray, tmp: Path, repeats: int
                  ) -> tuple[float, float]:
    """Seconds for one client sending the whole recording, then four clients a quarter each
    at once, to the real app (in this process, under uvicorn)."""
    from officellm.app.server import create_app
    from officellm.app.server_settings import ServerSettings

    def no_chat_model():
        raise RuntimeError("the benchmark serves no chat model")

    app = create_app(ServerSettings(api_keys=[KEY], database=str(tmp / "bench.db"),
                                    engine_in_process=True, audio_max_seconds=24 * 3600.0,
                                    audio_max_bytes=1 << 30, max_request_bytes=1 << 30),
                     no_chat_model)
    with app_in_thread(app) as url, httpx.Client(base_url=url, timeout=3600) as client:
        token = (tmp / "admin_token").read_text().strip()
        r = client.post("/admin/models", headers={"Authorization": f"Bearer {token}"},
                        json={"name": "whisper-tiny-random", "source": str(model_dir),
                              "kind": "transcribe"})
        r.raise_for_status()

        def post(samples: np.ndarray) -> None:
            r = client.post("/v1/audio/transcriptions", headers={"Authorization": f"Bearer {KEY}"},
                            files={"file": ("meeting.wav", wav_bytes(samples))},
                            data={"model": "whisper-tiny-random", "language": "en"})
            r.raise_for_status()

        post(audio[:SAMPLE_RATE * 5])  # loads the model
        one = best_of(repeats, lambda: post(audio))
        quarters = np.array_split(audio, 4)

        def four_clients() -> None:
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(post, quarters))

        four = best_of(repeats, four_clients)
    return one, four


@contextmanager
def app_in_thread(app) -> Iterator[str]:
    """Serve `app` under uvicorn from a thread of this process; yields its base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.bar([r["run"] for r in rows], [r["real_time_factor"] for r in rows],
           color=["#888" if r["run"] == "pipeline" else "#36c" for r in rows])
    ax.set_ylabel("real-time factor (s of work / s of audio; lower is better)")
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--window-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=3, help="each run's best of this many")
    p.add_argument("--out", type=Path, default=RESULTS / "transcription.json")
    args = p.parse_args()
    import torch
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    from benchmarks.random_whisper import build_tiny_whisper

    torch.set_num_threads(args.threads)
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model_dir = build_tiny_whisper(tmp / "whisper-tiny-random", d_model=384, layers=4,
                                       heads=6, base_vocab=50257,
                                       languages=tuple(LANGUAGES)[:99],
                                       max_new_tokens=args.window_tokens)
        audio, source = recording(args.minutes, tmp)
        seconds = audio.size / SAMPLE_RATE
        runs = {"pipeline": through_pipeline(model_dir, audio, args.batch, args.repeats),
                "transcriber": through_transcriber(model_dir, audio, args.batch, args.repeats)}
        runs["route, 1 client"], runs["route, 4 clients"] = through_route(
            model_dir, audio, tmp, args.repeats)
    rows = [{"run": run, "seconds": s, "real_time_factor": s / seconds,
             "vs_pipeline": runs["pipeline"] / s} for run, s in runs.items()]
    for row in rows:
        print(f"{row['run']:<18}{row['seconds']:>8.1f} s   RTF {row['real_time_factor']:.3f}"
              f"   {row['vs_pipeline']:.2f}x the pipeline's speed")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "machine": cpu_description(), "torch_threads": args.threads,
        "load_average": os.getloadavg(),
        "settings": vars(args) | {"out": str(args.out)}, "audio_seconds": seconds,
        "audio": source, "model": "whisper-tiny shape, random weights",
        "wall_s": time.monotonic() - t_start, "rows": rows}, indent=1))
    plot(rows, args.out.with_suffix(".png"),
         f"Whisper (tiny shape, random weights), {seconds / 60:.0f} min of audio, "
         f"{args.threads} threads")
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
