"""The planned footprint of a model (engine/memory_footprint.py), which the server's model
pool plans loads against its memory budget with: weights by the parameter count in the
model's dtype (a GGUF on the CPU: its blocks, as held), plus its KV pool."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from safetensors import safe_open

from officellm.engine import EngineConfig, estimate_footprint, parse_memory
from tests.support.tiny_models import shared_tiny_model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    return shared_tiny_model("llama", tmp_path_factory, smollm2_dir)


def _parameters(model_dir: Path) -> int:
    """The checkpoint's parameter count, from its safetensors headers."""
    total = 0
    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                total += math.prod(f.get_slice(name).get_shape())
    return total


def test_the_weights_are_the_checkpoints_parameters_in_the_models_dtype(tiny_llama) -> None:
    fp32 = estimate_footprint(EngineConfig(model=str(tiny_llama), dtype="float32",
                                           kv_cache_memory="32MiB"))
    bf16 = estimate_footprint(EngineConfig(model=str(tiny_llama), dtype="bfloat16",
                                           kv_cache_memory="32MiB"))
    assert fp32.weight_bytes == 4 * _parameters(tiny_llama)
    assert bf16.weight_bytes * 2 == fp32.weight_bytes


def test_the_kv_pool_is_the_models_kv_cache_memory(tiny_llama) -> None:
    planned = estimate_footprint(EngineConfig(model=str(tiny_llama), dtype="float32",
                                              kv_cache_memory="48MiB"))
    assert planned.kv_cache_bytes == parse_memory("48MiB")
    assert planned.total_bytes == planned.weight_bytes + planned.kv_cache_bytes


def test_auto_on_the_cpu_plans_float32_the_upper_bound(tiny_llama) -> None:
    auto = estimate_footprint(EngineConfig(model=str(tiny_llama), kv_cache_memory="32MiB"))
    assert auto.weight_bytes == 4 * _parameters(tiny_llama)


def test_a_gpu_model_without_a_kv_size_cannot_be_planned_and_says_what_to_give(
        tiny_llama) -> None:
    with pytest.raises(ValueError, match="give it a kv_cache_memory"):
        estimate_footprint(EngineConfig(model=str(tiny_llama), device="cuda"))


def test_a_gguf_on_the_cpu_is_planned_as_its_blocks_not_dense_weights() -> None:
    from officellm.engine.loading.model_loader import bundled_model_path

    gguf = bundled_model_path()
    planned = estimate_footprint(EngineConfig(model=str(gguf), kv_cache_memory="32MiB"))
    dense = estimate_footprint(EngineConfig(model=str(gguf), kv_cache_memory="32MiB",
                                            quantization="none"))
    file_bytes = gguf.stat().st_size
    # The file's blocks and its few float32 norms; the vocabulary in the header is not held.
    assert 0.9 * file_bytes < planned.weight_bytes < 1.05 * file_bytes
    assert dense.weight_bytes > 4 * planned.weight_bytes  # 135M parameters in float32


def test_a_loaded_engine_reports_the_weight_bytes_it_holds(smollm2_dir: Path) -> None:
    from officellm.engine import LLM

    llm = LLM(str(smollm2_dir), quantization="gguf", kv_cache_memory="32MiB")
    core = llm.llm_engine.engine_core
    assert llm.llm_engine.stats().weight_bytes == core.model.weight_bytes() > 0
