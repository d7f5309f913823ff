"""CUDA-graph batch sizes and start-up memory arithmetic (the parts that need no GPU)."""

from __future__ import annotations

import pytest
import torch

from officellm.engine.kv_plan import KVCacheTooSmallError, size_pool
from officellm.engine.loading.model_spec import ModelSpec
from officellm.engine.models.decoder import DecoderModel
from officellm.engine.worker.cuda_graphs import capture_sizes
from officellm.engine.worker.memory_profiling import MemoryProfile, kv_budget_bytes, run_dummy_step
from officellm.kernels.reference import reference


def test_capture_sizes_cover_every_batch():
    sizes = capture_sizes(100)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 100
    assert all(b <= next(s for s in sizes if s >= b) < b + 16 for b in range(1, 101))
    assert capture_sizes(3) == [1, 2, 3]


def test_kv_budget_formula():
    gib = 1024**3
    assert kv_budget_bytes(100 * gib, 0.9, 15 * gib, 2 * gib, gib, gib) == 71 * gib
    profile = MemoryProfile(total=10 * gib, utilization=0.5, weights=6 * gib,
                            peak_activations=gib, graph_pools=0, other=0)
    assert profile.kv_budget == -2 * gib  # negative: nothing fits


def test_too_small_budget_is_refused_with_the_numbers():
    # Qwen2.5-7B with its YaRN x4: 131,072 tokens is within the window it is made for.
    spec = ModelSpec.from_config_dict({
        "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "vocab_size": 152064, "max_position_embeddings": 32768,
        "rope_scaling": {"type": "yarn", "factor": 4.0,
                         "original_max_position_embeddings": 32768}})
    budget = kv_budget_bytes(24 * 1024**3, 0.9, 15 * 1024**3, 3 * 1024**3, 0, 1024**3)
    with pytest.raises(KVCacheTooSmallError, match="gpu-memory-utilization") as err:
        size_pool(spec, budget, spec.kv_bytes_per_token(2) * 16, 16, 131072,
                  "--gpu-memory-utilization")
    assert "the largest max_model_len that fits is" in str(err.value)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("decode", [False, True])
def test_profiling_step_runs_the_model_without_a_pool(decode, backend):
    """The synthetic step reads only the zero null block and writes nothing."""
    spec = ModelSpec.from_config_dict({
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 50, "max_position_embeddings": 64})
    ops = type("Ops", (), {k: staticmethod(getattr(reference, k)) for k in (
        "rms_norm", "fused_add_rms_norm", "apply_rotary", "silu_and_mul")})
    model = DecoderModel(spec, torch.float32, ops)
    for p in model.parameters():
        p.data.normal_()
    logits = run_dummy_step(model, spec, torch.float32, torch.device("cpu"), 40, 8, 16,
                            decode=decode, backend=backend)
    assert logits.shape == (8, 50) and torch.isfinite(logits).all()
