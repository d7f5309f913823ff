"""Which matmul weights stay in low-bit blocks (`--quantization`, vLLM's flag name).

- `gguf`: a GGUF's Q8_0, Q4_0, Q4_1, Q4_K and Q6_K tensors run in their blocks
  (kernels/cpu/quant_matmul.cpp), a mixture's stacked experts too (the MoE kernel reads
  their block rows); a tensor of another type is dequantized, with one WARNING naming the
  type.
- `int8` / `int4`: a safetensors model's matmul weights are quantized at load, per 32
  weights (int8: Q8_0, a scale per group; int4: Q4_1, a scale and an offset per group).
- `none`: every weight dequantized to the model dtype (what transformers computes with).
- `auto`: for a GGUF on the CPU, blocks or dense weights by batch size, as timed at load
  (engine/worker/quantization_choice.py); `none` elsewhere.

Blocks run on the CPU (the cpu and torch backends), on one rank: the Triton kernels read
dense weights, and a row-parallel shard would cut the blocks' input features.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import torch

from officellm.engine.loading.gguf_tensors import GgufWeights, QuantizedTensor, read_quantized
from officellm.engine.models.moe import ExpertBlocks
from officellm.kernels.ops import MoePack
from officellm.kernels.reference import quant_reference

logger = logging.getLogger("officellm.engine.precision.weight_quantization")

QUANTIZATIONS = ("auto", "gguf", "int8", "int4", "none")
_BLOCK_BACKENDS = ("cpu", "torch")
# The Hugging Face names of the weights a matmul reads (and the embedding table).
_MATMUL_SUFFIXES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                    "gate_proj.weight", "up_proj.weight", "down_proj.weight",
                    "embed_tokens.weight", "lm_head.weight")


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


def expert_holding(requested: str, backend: str, world_size: int,
                   pack: MoePack | None) -> ExpertBlocks:
    """Which block types a mixture's experts are kept in, as a checkpoint ships them (a
    GGUF's blocks, gpt-oss's MXFP4): those the backend's MoE kernel reads (the CPU kernel and
    the reference: every type with a kernel; the fused Triton kernel: MXFP4), on one rank,
    unless `--quantization none`. Experts are most of a mixture's bytes: kept in blocks, they
    serve every batch size (auto's dense copy for large batches is the other matmuls')."""
    check_quantization(requested)
    if requested == "none" or world_size > 1:
        return ExpertBlocks()
    if backend in _BLOCK_BACKENDS:
        return ExpertBlocks(frozenset(quant_reference.GROUP_BYTES), pack)
    if backend == "triton":
        return ExpertBlocks(frozenset({quant_reference.MXFP4}))
    return ExpertBlocks()


def gguf_blocks(path: Path, num_heads: int, num_kv_heads: int) -> GgufWeights:
    """The GGUF's tensors that have a kernel (and its MoE layers' experts); one WARNING per
    type that has none, one for experts whose gate and up differ in type."""
    weights = read_quantized(path, num_heads, num_kv_heads)
    for type_name, names in sorted(weights.unsupported.items()):
        logger.warning("GGUF tensor type %s has no kernel here: %d tensor(s) (e.g. %s) are "
                       "dequantized, with the fused matmul they belong to", type_name,
                       len(names), names[0])
    if weights.mixed_experts:
        logger.warning("GGUF experts of %d layer(s) (e.g. layer %d) store gate and up in two "
                       "block types: those layers' experts are dequantized",
                       len(weights.mixed_experts), weights.mixed_experts[0])
    return weights


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
