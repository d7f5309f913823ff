"""Which matmul weights stay in low-bit blocks (`--quantization`, vLLM's flag name).

- `gguf`: a GGUF's Q8_0, Q4_0, Q4_1, Q4_K and Q6_K tensors run in their blocks
  (kernels/cpu_quant_matmul.cpp); a tensor of another type is dequantized, with one WARNING
  naming the type.
- `int8` / `int4`: a safetensors model's matmul weights are quantized at load, per 32
  weights (int8: Q8_0, a scale per group; int4: Q4_1, a scale and an offset per group).
- `none`: every weight dequantized to the model dtype (what transformers computes with).
- `auto`: for a GGUF on the CPU, `gguf` when its blocks measure faster than the dense
  weights at an office batch (BATCH_ROWS rows, one layer's largest matmul, timed at load:
  an AVX-512-BF16 CPU's packed bf16 matmul can beat the integer kernel there, an AVX2 CPU's
  float32 one does not); else `none`.

Blocks run on the CPU (the cpu and torch backends), on one rank: the Triton kernels read
dense weights, and a row-parallel shard would cut the blocks' input features.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from engine.loading.gguf_tensors import GgufWeights, QuantizedTensor, read_quantized
from kernels import quant_reference

logger = logging.getLogger("engine.weight_quantization")

QUANTIZATIONS = ("auto", "gguf", "int8", "int4", "none")
_BLOCK_BACKENDS = ("cpu", "torch")
# The Hugging Face names of the weights a matmul reads (and the embedding table).
_MATMUL_SUFFIXES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                    "gate_proj.weight", "up_proj.weight", "down_proj.weight",
                    "embed_tokens.weight", "lm_head.weight")


BATCH_ROWS = 16  # the office case: 16 colleagues typing at once
WIN_MARGIN = 0.9  # blocks must be at least 10% faster


def blocks_are_faster(dense: Callable[[torch.Tensor], torch.Tensor],
                      blocks: Callable[[torch.Tensor], torch.Tensor], in_features: int,
                      dtype: torch.dtype) -> tuple[bool, float, float]:
    """(blocks faster?, dense ms, blocks ms) for one matmul at BATCH_ROWS rows."""
    x = torch.randn(BATCH_ROWS, in_features).to(dtype)

    def best_of(fn: Callable[[torch.Tensor], torch.Tensor]) -> float:
        fn(x)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - t0)
        return min(times) * 1e3

    dense_ms, blocks_ms = best_of(dense), best_of(blocks)
    # A clear win only: a coin flip between two equal timings would change the numbers
    # from one start to the next.
    return blocks_ms < WIN_MARGIN * dense_ms, dense_ms, blocks_ms


def check_quantization(requested: str) -> None:
    """ValueError naming the choices, for an unknown `--quantization`."""
    if requested not in QUANTIZATIONS:
        raise ValueError(f"Unknown quantization {requested!r}; use one of "
                         f"{', '.join(QUANTIZATIONS)}.")


def resolve_quantization(requested: str, gguf: Path | None, backend: str,
                         world_size: int) -> str:
    """`gguf`, `int8`, `int4` or `none` for this model (`gguf`: the GGUF file it was
    converted from, None for a safetensors model), attention backend and rank count;
    ValueError with the reason for a combination that cannot run."""
    check_quantization(requested)
    if requested == "none":
        return "none"
    runs_blocks = backend in _BLOCK_BACKENDS and world_size == 1
    if requested == "auto":
        return "gguf" if gguf is not None and runs_blocks else "none"
    if not runs_blocks:
        raise ValueError(f"--quantization {requested} runs on the CPU (cpu or torch backend) "
                         f"with one rank; this engine uses the {backend} backend with "
                         f"{world_size} rank(s): use --quantization none.")
    if requested == "gguf" and gguf is None:
        raise ValueError("--quantization gguf applies to a .gguf model; this model is "
                         "safetensors: use int8 or int4 to quantize it at load, or none.")
    if requested in ("int8", "int4") and gguf is not None:
        raise ValueError(f"--quantization {requested} quantizes a safetensors model at load; "
                         f"{gguf.name} is already quantized: use gguf (its own blocks) or none.")
    return requested


def gguf_blocks(path: Path, num_heads: int, num_kv_heads: int) -> dict[str, QuantizedTensor]:
    """The GGUF's tensors that have a kernel; one WARNING per type that has none."""
    weights: GgufWeights = read_quantized(path, num_heads, num_kv_heads)
    for type_name, names in sorted(weights.unsupported.items()):
        logger.warning("GGUF tensor type %s has no kernel here: %d tensor(s) (e.g. %s) are "
                       "dequantized, with the fused matmul they belong to", type_name,
                       len(names), names[0])
    return weights.tensors


def quantize_at_load(weights: Iterable[tuple[str, torch.Tensor]],
                     method: str) -> dict[str, QuantizedTensor]:
    """int8 (Q8_0) or int4 (Q4_1) blocks of a checkpoint's matmul weights whose input
    features are a multiple of 32 (the others stay dense)."""
    quantize = quant_reference.quantize_q8_0 if method == "int8" else quant_reference.quantize_q4_1
    fmt = quant_reference.Q8_0 if method == "int8" else quant_reference.Q4_1
    out: dict[str, QuantizedTensor] = {}
    for name, tensor in weights:
        if not name.endswith(_MATMUL_SUFFIXES):
            continue
        if not name.startswith(("model.", "lm_head")):
            name = f"model.{name}"
        if tensor.dim() == 2 and tensor.shape[1] % quant_reference.QK == 0:
            out[name] = QuantizedTensor(fmt, quantize(tensor), tensor.shape[1])
    return out
