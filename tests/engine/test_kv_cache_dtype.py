"""--kv-cache-dtype: a float32 engine may store its KV cache in 16 bits (half the bytes per
token, twice the tokens in the same pool), any engine in fp8 (a quarter of float32's, half of
16 bits'); what cannot be stored is refused at start."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

from officellm.engine import SamplingParams
from officellm.engine.config import EngineConfig
from officellm.engine.precision.kv_cache_dtype import resolve_kv_cache_dtype
from tests.engine.conftest import make_llm

MAX_NEW = 16  # a cache read wrongly derails an answer within a few tokens


def _engine_core(model_dir, **kwargs):
    return make_llm(model_dir, kv_cache_memory="64MiB", max_model_len=1024,
                    **kwargs).llm_engine.engine_core


def _greedy_tokens(model_dir, prompts, backend: str, kv_dtype: str) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    llm = make_llm(model_dir, kv_cache_dtype=kv_dtype, attention_backend=backend)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def float32_tokens(smollm2_dir, chat_prompt_ids) -> dict[str, list[list[int]]]:
    """Per attention backend, the greedy tokens over a float32 cache (computed once)."""
    return {backend: _greedy_tokens(smollm2_dir, chat_prompt_ids, backend, "float32")
            for backend in ("cpu", "torch")}


def _tokens_agreeing(model_dir, prompts, float32_tokens, backend: str, kv_dtype: str
                     ) -> list[int]:
    """Per prompt, how many greedy tokens over a `kv_dtype` cache equal the float32 cache's
    before the first difference."""
    ours = _greedy_tokens(model_dir, prompts, backend, kv_dtype)
    return [next((i for i, (a, b) in enumerate(zip(ref, tokens)) if a != b), MAX_NEW)
            for ref, tokens in zip(float32_tokens[backend], ours, strict=True)]


@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16"])
def test_a_16_bit_cache_halves_the_bytes_per_token_and_doubles_the_pool(smollm2_dir, kv_dtype):
    full = _engine_core(smollm2_dir)
    half = _engine_core(smollm2_dir, kv_cache_dtype=kv_dtype)
    assert full.bytes_per_token == 46_080 and half.bytes_per_token == 23_040
    assert half.kv.pool.num_blocks == 2 * full.kv.pool.num_blocks
    assert half.runner.k_caches[0].dtype == getattr(torch, kv_dtype)
    assert half.dtype == torch.float32  # the model still computes in float32
    assert half.stats().kv_cache_dtype == kv_dtype and full.stats().kv_cache_dtype == "float32"


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_greedy_output_over_a_16_bit_cache_follows_the_float32_one(smollm2_dir, chat_prompt_ids,
                                                                   float32_tokens, backend):
    """Not equal token for token (16-bit keys move the logits by more than the near-tie
    rule's 1e-4), but a cache read wrongly would derail every answer within a few tokens."""
    agreed = _tokens_agreeing(smollm2_dir, chat_prompt_ids, float32_tokens, backend, "float16")
    assert sum(agreed) / len(agreed) >= MAX_NEW / 2, agreed


def test_a_quantized_kv_dtype_without_kernels_is_refused_with_the_supported_list():
    with pytest.raises(ValueError, match="not supported by this build's kernels; use one of "
                                         "auto, float32, bfloat16, float16, fp8_e4m3, fp8_e5m2, "
                                         "int8"):
        EngineConfig(kv_cache_dtype="fp8_inc")


@pytest.mark.parametrize(("name", "stored"), [("fp8", torch.float8_e4m3fn),
                                              ("fp8_e4m3", torch.float8_e4m3fn),
                                              ("fp8_e5m2", torch.float8_e5m2),
                                              ("int8", torch.int8)])
def test_one_byte_caches_are_stored_under_any_compute_dtype_on_every_backend(name, stored):
    for compute in (torch.float32, torch.bfloat16, torch.float16):
        for backend in ("cpu", "torch", "triton"):
            assert resolve_kv_cache_dtype(name, compute, backend) == stored


def test_e4m3_on_a_gpu_without_fp8_units_is_refused_with_the_alternative():
    with pytest.raises(ValueError, match="compute capability 8.9 or newer .this one is 8.0.; "
                                         "use int8, fp8_e5m2 or auto"):
        resolve_kv_cache_dtype("fp8_e4m3", torch.bfloat16, "triton", (8, 0))
    assert resolve_kv_cache_dtype("fp8_e4m3", torch.bfloat16, "triton", (9, 0)) == \
        torch.float8_e4m3fn


def test_an_fp8_cache_quarters_a_float32_cache_and_is_reported_by_vllms_name(smollm2_dir):
    full = _engine_core(smollm2_dir)
    fp8 = _engine_core(smollm2_dir, kv_cache_dtype="fp8_e4m3")
    assert fp8.bytes_per_token == 11_520  # 46,080 / 4
    assert fp8.kv.pool.num_blocks == 4 * full.kv.pool.num_blocks
    assert fp8.runner.k_caches[0].dtype == torch.float8_e4m3fn
    assert fp8.stats().kv_cache_dtype == "fp8_e4m3"


def test_an_int8_cache_counts_each_rows_scale(smollm2_dir):
    int8 = _engine_core(smollm2_dir, kv_cache_dtype="int8")
    assert int8.bytes_per_token == 2 * 30 * 3 * (64 + 4) == 12_240
    assert int8.runner.k_caches[0].dtype == torch.int8
    assert int8.runner.k_caches[0].shape[-1] == 68  # 64 values, then the float32 scale
    assert int8.stats().kv_cache_dtype == "int8"


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "int8"])
def test_greedy_output_over_a_one_byte_cache_follows_the_float32_one(smollm2_dir,
                                                                     chat_prompt_ids,
                                                                     float32_tokens, backend,
                                                                     kv_dtype):
    """One byte per value moves the logits more than 16 bits do, so answers drift from the
    float32 cache's sooner; a cache read or written wrongly (a bad conversion, a lost scale,
    a NaN, a lost block) derails every answer at once. The quality cost is measured by
    benchmarks/kv_cache_quality.py, not asserted here."""
    agreed = _tokens_agreeing(smollm2_dir, chat_prompt_ids, float32_tokens, backend,
                              kv_dtype)
    assert sum(agreed) / len(agreed) >= 4, agreed


def test_an_unknown_kv_dtype_is_refused():
    with pytest.raises(ValueError, match="Unknown kv_cache_dtype 'float8'"):
        EngineConfig(kv_cache_dtype="float8")


def test_auto_stores_the_compute_dtype_where_it_is_16_bits_or_on_triton():
    for compute in (torch.bfloat16, torch.float16):
        for backend in ("cpu", "torch", "triton"):
            assert resolve_kv_cache_dtype("auto", compute, backend) == compute
    assert resolve_kv_cache_dtype("auto", torch.float32, "triton") == torch.float32


def test_auto_stores_a_float32_models_cache_in_bfloat16_on_the_cpu_and_says_so(caplog):
    with caplog.at_level(logging.INFO, logger="officellm.engine.precision.kv_cache_dtype"):
        for backend in ("cpu", "torch"):
            assert resolve_kv_cache_dtype("auto", torch.float32, backend) == torch.bfloat16
    assert "kv_cache_dtype auto -> bfloat16: a float32 model on the cpu backend" in caplog.text


def test_a_default_float32_engine_has_a_bfloat16_cache_and_float32_keeps_32_bits(smollm2_dir):
    auto = _engine_core(smollm2_dir, kv_cache_dtype="auto")
    full = _engine_core(smollm2_dir, kv_cache_dtype="float32")
    assert auto.dtype == torch.float32 and auto.runner.k_caches[0].dtype == torch.bfloat16
    assert auto.bytes_per_token == 23_040 and full.bytes_per_token == 46_080
    assert auto.stats().kv_cache_dtype == "bfloat16"


def test_a_16_bit_cache_is_read_under_a_float32_model_on_the_cpu_and_torch_backends():
    for backend in ("cpu", "torch"):
        assert resolve_kv_cache_dtype("fp16", torch.float32, backend) == torch.float16
        assert resolve_kv_cache_dtype("bf16", torch.float32, backend) == torch.bfloat16


@pytest.mark.parametrize(("requested", "compute", "backend"), [
    ("float16", torch.float32, "triton"),   # the Triton kernels read the compute dtype only
    ("float16", torch.bfloat16, "cpu"),     # a cache in another 16-bit type than the model's
    ("float32", torch.bfloat16, "torch"),   # wider than the model
])
def test_a_cache_dtype_the_kernels_cannot_read_is_refused(requested, compute, backend):
    with pytest.raises(ValueError, match="is not supported"):
        resolve_kv_cache_dtype(requested, compute, backend)


def test_serve_refuses_an_unsupported_cache_at_start_with_the_supported_list(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "officellm.cli", "serve", "--kv-cache-dtype", "fp8_inc",
         "--db", str(tmp_path / "x.db")], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert ("kv_cache_dtype 'fp8_inc' is not supported by this build's kernels; use one of "
            "auto, float32, bfloat16, float16, fp8_e4m3, fp8_e5m2, int8.") in result.stderr
    assert not (tmp_path / "x.db").exists()  # refused before anything was set up
