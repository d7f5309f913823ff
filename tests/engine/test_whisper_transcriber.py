"""The Whisper transcriber against transformers' own Whisper generate, on a tiny random
Whisper (benchmarks/random_whisper.py): a window's tokens are generate's for that window
alone, batching windows changes nothing, and a long recording is cut into 30 s windows whose
segments are timed from the recording's start."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from benchmarks.random_whisper import build_tiny_whisper
from officellm.engine import (
    SAMPLE_RATE,
    AsyncTranscriber,
    TranscriptionOptions,
    WhisperTranscriber,
)

MAX_NEW_TOKENS = 12


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory):
    return build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))


@pytest.fixture(scope="module")
def transcriber(whisper_dir) -> WhisperTranscriber:
    return WhisperTranscriber(whisper_dir, max_new_tokens=MAX_NEW_TOKENS)


def _noise(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.1 * rng.standard_normal(int(seconds * SAMPLE_RATE))).astype(np.float32)


def _reference(transcriber: WhisperTranscriber, audio: np.ndarray, **kwargs) -> list[int]:
    """transformers' Whisper generate on one window, its raw sequence."""
    features = transcriber.processor.feature_extractor(
        audio, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
    with torch.inference_mode():
        out = transcriber.model.generate(features, max_new_tokens=MAX_NEW_TOKENS,
                                         return_dict_in_generate=True,
                                         force_unique_generate_call=True, do_sample=False,
                                         **kwargs)
    return out.sequences[0].tolist()


@pytest.mark.parametrize("options", [
    TranscriptionOptions(language="en"),
    TranscriptionOptions(language="de", task="translate"),
    TranscriptionOptions(language="en", timestamps=True),
], ids=["transcribe", "translate", "timestamps"])
def test_window_tokens_equal_transformers_generate(transcriber, options):
    audio = _noise(7.0, seed=1)
    [ours] = transcriber.generate([audio], options)
    reference = _reference(transcriber, audio, language=options.language, task=options.task,
                           return_timestamps=options.timestamps)
    assert ours == reference
    assert ours[:3] == transcriber.processor.tokenizer.convert_tokens_to_ids(
        ["<|startoftranscript|>", f"<|{options.language}|>", f"<|{options.task}|>"])


def test_prompt_ids_condition_the_window_as_in_generate(transcriber):
    audio = _noise(5.0, seed=2)
    options = TranscriptionOptions(language="en", prompt="Meeting about the budget")
    [ours] = transcriber.generate([audio], options)
    prompt_ids = transcriber.processor.get_prompt_ids(options.prompt, return_tensors="pt")
    assert ours == _reference(transcriber, audio, language="en", task="transcribe",
                              prompt_ids=prompt_ids)


def test_a_batch_of_windows_equals_each_window_alone(transcriber):
    windows = [_noise(30.0, seed=3), _noise(12.0, seed=4), _noise(0.5, seed=5)]
    options = TranscriptionOptions(language="en", timestamps=True)
    together = transcriber.generate(windows, options)
    alone = [transcriber.generate([w], options)[0] for w in windows]
    assert together == alone


def test_a_long_recording_is_cut_into_windows_timed_from_its_start(whisper_dir):
    async def run() -> tuple[list, int]:
        engine = AsyncTranscriber(lambda: WhisperTranscriber(whisper_dir,
                                                             max_new_tokens=MAX_NEW_TOKENS))
        engine.start()
        assert await asyncio.to_thread(engine.wait_ready, 60)
        try:
            audio = _noise(95.0, seed=6)  # 30 + 30 + 30 + 5 s
            options = TranscriptionOptions(language="en", timestamps=True)
            results = [w async for w in engine.transcribe(audio, options)]
            return results, engine.stats().windows
        finally:
            engine.stop()

    results, windows_run = asyncio.run(run())
    assert [w.index for w in results] == [0, 1, 2, 3] and windows_run == 4
    for window in results:
        assert all(window.index * 30.0 <= s.start <= s.end <= (window.index + 1) * 30.0
                   for s in window.segments)
