"""The default CPU path stays as faithful to the model as written as llama.cpp is on the
same file: the bundled GGUF's next-token distributions, read as generation reads them (one
token a step, over its blocks), against the file dequantized to float32 and run dense.
benchmarks/fidelity.py measures the same over the whole text beside llama-perplexity's
--kl-divergence (docs/performance.md, fidelity): on the bundled Q4_1, llama.cpp's mean KL
is 0.0026 and its top-1 agreement 97.1%."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.teacher_forcing import as_decodes, as_prefill
from officellm.engine import LLM

TEXT = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "fidelity_text.txt"
TOKENS = 384


@pytest.fixture(scope="module")
def text_ids(smollm2_tokenizer) -> list[int]:
    return smollm2_tokenizer(TEXT.read_text())["input_ids"][:TOKENS]


@pytest.fixture(scope="module")
def float32_model(smollm2_dir: Path, text_ids: list[int]) -> torch.Tensor:
    llm = LLM(str(smollm2_dir), dtype="float32", quantization="none", kv_cache_dtype="float32",
              kv_cache_memory="64MiB", max_model_len=1024)
    return as_prefill(llm, text_ids)[TOKENS // 2:]


def _kl_and_top1(reference: torch.Tensor, other: torch.Tensor) -> tuple[float, float]:
    kl = (reference.exp() * (reference - other)).sum(-1).mean().item()
    return kl, (reference.argmax(-1) == other.argmax(-1)).float().mean().item()


@pytest.mark.parametrize("settings", [{}, {"dtype": "float32"}], ids=["default", "float32"])
def test_generation_over_the_gguf_blocks_stays_as_close_to_the_float32_model_as_llama_cpp(
        smollm2_dir, text_ids, float32_model, settings):
    llm = LLM(str(smollm2_dir), kv_cache_memory="64MiB", max_model_len=1024, **settings)
    kl, top1 = _kl_and_top1(float32_model, as_decodes(llm, text_ids)[TOKENS // 2:])
    # llama.cpp's own numbers on this file (above), with a margin for a shorter text; the
    # offset term from x's float sum (not the quantized block's) gave 0.014 and 93%.
    assert kl < 0.0035 and top1 > 0.95, (kl, top1)


def test_a_gguf_whose_auto_dtype_is_bf16_keeps_float32_between_its_matmuls(
        smollm2_dir, monkeypatch):
    from officellm.engine.models import packed_linear
    from officellm.engine.worker import worker

    if not packed_linear.can_pack(torch.device("cpu"), torch.bfloat16):
        pytest.skip("this CPU has no bf16 matmul instructions: auto never chooses bf16 here")
    monkeypatch.setattr(worker, "resolve_dtype", lambda *_: torch.bfloat16)
    core = LLM(str(smollm2_dir), kv_cache_memory="64MiB",
               max_model_len=1024).llm_engine.engine_core
    layer = core.model.layers[0]
    assert core.dtype == torch.float32 and core.model.norm.dtype == torch.float32
    assert core.kv_dtype == torch.float16  # llama.cpp's cache for the same file
    assert layer.qkv.weight.dtype == torch.bfloat16 or layer.qkv.packed.dtype == torch.bfloat16
