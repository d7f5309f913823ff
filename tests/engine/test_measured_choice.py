"""`--dtype auto` is measured once per model shape and machine and kept (engine/precision/measured_choice.py):
a restart never draws the timing again, so never changes the weights' dtype or the answers."""

from __future__ import annotations

import logging

import pytest
import torch

from officellm.engine import SamplingParams
from officellm.engine.precision import dtype_choice
from officellm.engine.precision.dtype_choice import resolve_dtype
from officellm.kernels.cpu_features import CpuFeatures
from tests.engine.conftest import make_llm

CPU = torch.device("cpu")
BF16_CPU = CpuFeatures(frozenset({"avx2", "fma", "avx512f", "avx512_bf16"}))


@pytest.fixture
def flipping_timings(monkeypatch) -> list[torch.dtype]:
    """A CPU with bf16 instructions whose timings flip: bf16 twice as fast at the first
    measurement, half as fast at every later one. Returns the dtypes timed, in order."""
    timed: list[torch.dtype] = []

    def fake(dtype: torch.dtype, m: int, k: int, n: int) -> float:
        timed.append(dtype)
        first = len(timed) <= 2
        return (1.0 if dtype == torch.float32 else 0.5) if first else (
            1.0 if dtype == torch.float32 else 2.0)

    monkeypatch.setattr(dtype_choice, "cpu_features", lambda: BF16_CPU)
    monkeypatch.setattr(dtype_choice, "_time_linear", fake)
    return timed


def test_auto_keeps_its_first_measurement_across_starts(tmp_path, flipping_timings):
    first = resolve_dtype("auto", CPU, None, 576, 1536, cache_dir=tmp_path)
    again = resolve_dtype("auto", CPU, None, 576, 1536, cache_dir=tmp_path)
    assert (first, again) == (torch.bfloat16, torch.bfloat16)
    assert len(flipping_timings) == 2  # measured once, fp32 and bf16
    assert (tmp_path / dtype_choice.CHOICES_FILE).exists()


def test_another_shape_is_measured_on_its_own(tmp_path, flipping_timings):
    resolve_dtype("auto", CPU, None, 576, 1536, cache_dir=tmp_path)
    assert resolve_dtype("auto", CPU, None, 2048, 8192, cache_dir=tmp_path) == torch.float32
    assert len(flipping_timings) == 4


def test_the_log_says_the_choice_was_kept_and_where(tmp_path, flipping_timings, caplog):
    resolve_dtype("auto", CPU, None, 576, 1536, cache_dir=tmp_path)
    with caplog.at_level(logging.INFO, logger="officellm.engine.precision.dtype_choice"):
        resolve_dtype("auto", CPU, None, 576, 1536, cache_dir=tmp_path)
    assert "dtype auto -> bfloat16" in caplog.text
    assert f"as measured at the first start on this machine (delete {tmp_path}" in caplog.text


def test_a_chosen_dtype_is_not_measured_at_all(tmp_path, flipping_timings):
    assert resolve_dtype("float32", CPU, None, cache_dir=tmp_path) == torch.float32
    assert flipping_timings == []


def test_two_starts_of_one_model_run_the_same_dtype_and_give_the_same_answer(
        smollm2_dir, tmp_path, monkeypatch, flipping_timings):
    """What a user sees: the same question after a restart gets the same answer."""
    monkeypatch.setenv("OFFICELLM_CACHE_DIR", str(tmp_path))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    runs = []
    for _ in range(2):
        llm = make_llm(smollm2_dir, dtype="auto", kv_cache_dtype="auto")
        runs.append((llm.llm_engine.engine_core.dtype,
                     llm.generate([[1, 504, 3458, 282]], params)[0].outputs[0].token_ids))
        llm.close()
    assert runs[0][0] == runs[1][0] == torch.bfloat16
    assert runs[0][1] == runs[1][1]
