"""A GGUF file's quantized matmul weights, as they are stored, under Hugging Face names.

The dequantized copy that model_loader caches serves every other weight (norms, biases) and
any tensor type without a kernel here. What this reads is kept in its blocks: rows of
bytes, one row per output feature, so slicing and concatenating rows (fusing q/k/v, cutting
a tensor-parallel shard of the outputs) never touches a block.

Every family's names come from gguf_names.py: Phi-3's fused qkv_proj and gate_up_proj keep
their rows as stored (the decoder's fused matmuls take them whole), llama-arch q/k rows are
put back in Hugging Face's order. A mixture's stacked experts become one `ExpertWeights`
per layer: per expert, its gate rows then its up rows (w13), and its down rows (w2).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from officellm.engine.loading.gguf_config import model_type_of
from officellm.engine.loading.gguf_layout import GgufLayout, GgufTensorInfo, read_layout
from officellm.engine.loading.gguf_names import (
    EXPERT_PARTS,
    permuted_heads,
    tensor_place,
    unpermute_rows,
)
from officellm.kernels.reference import quant_reference
from officellm.kernels.reference.moe import ExpertWeights

logger = logging.getLogger("officellm.engine.loading.gguf_tensors")


@dataclass(frozen=True)
class QuantizedTensor:
    """One weight in GGUF blocks: `data` uint8 [rows, bytes per row] of type `fmt`."""

    fmt: int  # ggml_type id (kernels.reference.quant_reference.Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)
    data: torch.Tensor
    in_features: int

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    def take_rows(self, index: torch.Tensor | slice) -> QuantizedTensor:
        return QuantizedTensor(self.fmt, self.data[index].contiguous(), self.in_features)


@dataclass(frozen=True)
class GgufWeights:
    """The quantized weights of a GGUF with a kernel, and the types that have none."""

    tensors: dict[str, QuantizedTensor]  # Hugging Face name -> blocks
    experts: dict[int, ExpertWeights]  # MoE layer -> its experts in blocks (no biases)
    # type name -> the Hugging Face names left dequantized (stacked experts: the layer's
    # prefix and llama.cpp's part, `model.layers.3.ffn_down_exps`)
    unsupported: dict[str, list[str]]
    # MoE layers whose gate and up are stored in two block types (kept dense: w13 is one).
    mixed_experts: list[int] = field(default_factory=list)


def read_quantized(path: Path, num_heads: int, num_kv_heads: int) -> GgufWeights:
    """Read the matmul weights of the GGUF at `path` that a kernel can run in their blocks.

    llama.cpp's converter permutes the rows of a llama-arch model's q and k projections (its
    rotary layout); transformers undoes that on load, and so do we, on whole rows of blocks.
    """
    layout = read_layout(path)
    arch = str(layout.metadata.get("general.architecture", ""))
    model_type = model_type_of(layout) if arch else "llama"
    tensors: dict[str, QuantizedTensor] = {}
    unsupported: dict[str, list[str]] = {}
    stacks: dict[int, dict[str, QuantizedTensor]] = {}
    for t in layout.tensors:
        place = tensor_place(model_type, t.name)
        if place is None or place.kind != "weight" or len(t.shape) < 2:
            continue
        label = (f"{place.name}{place.part}" if place.is_experts else place.name)
        if int(t.tensor_type) not in quant_reference.GROUP_BYTES:
            if t.tensor_type.name not in ("F32", "F16", "BF16"):
                unsupported.setdefault(t.tensor_type.name, []).append(label)
            continue
        q = _blocks(layout, t)
        if place.is_experts:
            assert place.layer is not None
            stacks.setdefault(place.layer, {})[place.part] = q
            continue
        heads = permuted_heads(arch, place.part, num_heads, num_kv_heads)
        if heads is not None:
            q = q.take_rows(unpermute_rows(q.rows, heads))
        tensors[place.name] = q
    experts, mixed = _expert_weights(stacks)
    return GgufWeights(tensors, experts, unsupported, mixed)


def _blocks(layout: GgufLayout, t: GgufTensorInfo) -> QuantizedTensor:
    """The tensor's rows of blocks: [rows, bytes] (or [E, rows, bytes] for stacked experts)."""
    data = torch.from_numpy(layout.tensor_bytes(t))
    return QuantizedTensor(int(t.tensor_type), data.reshape(*reversed(t.shape[1:]), -1),
                           t.shape[0])


def expert_layers_in_blocks(layout: GgufLayout, model_type: str) -> set[int]:
    """The MoE layers whose experts read_quantized gives in blocks: all three stacked
    matrices in types with a kernel, gate and up in the same one (the dense copy of the
    file leaves them out: they are read from the file)."""
    types: dict[int, dict[str, int]] = {}
    for t in layout.tensors:
        place = tensor_place(model_type, t.name)
        if place is not None and place.is_experts and place.kind == "weight":
            assert place.layer is not None
            types.setdefault(place.layer, {})[place.part] = int(t.tensor_type)
    gate, up, down = EXPERT_PARTS
    return {layer for layer, parts in types.items()
            if len(parts) == 3 and all(f in quant_reference.GROUP_BYTES for f in parts.values())
            and parts[gate] == parts[up]}


def _expert_weights(stacks: dict[int, dict[str, QuantizedTensor]]
                    ) -> tuple[dict[int, ExpertWeights], list[int]]:
    """Each layer whose three expert tensors are all in blocks, as ExpertWeights; and the
    layers left dense because gate and up differ in type."""
    gate_part, up_part, down_part = EXPERT_PARTS
    experts: dict[int, ExpertWeights] = {}
    mixed: list[int] = []
    for layer, parts in sorted(stacks.items()):
        if not all(p in parts for p in EXPERT_PARTS):
            continue
        gate, up, down = parts[gate_part], parts[up_part], parts[down_part]
        if gate.fmt != up.fmt:
            mixed.append(layer)
            continue
        w13 = torch.cat([gate.data, up.data], dim=1)
        experts[layer] = ExpertWeights(w13, down.data, fmt13=gate.fmt, fmt2=down.fmt)
    return experts, mixed


def held_weight_bytes(path: Path, dense_nbytes: int) -> int:
    """The bytes a CPU engine holds for the GGUF at `path` when its matmuls read the file's
    blocks (--quantization gguf, and auto where blocks serve every batch size): every tensor
    of a type with a kernel as stored, the rest (norms, biases, types without a kernel)
    dequantized at `dense_nbytes` a value. Read from the file's header only."""
    layout = read_layout(path)
    total = 0
    for t in layout.tensors:
        if int(t.tensor_type) in quant_reference.GROUP_BYTES and len(t.shape) >= 2:
            total += t.nbytes
        else:
            total += dense_nbytes * int(torch.Size(t.shape).numel())
    return total
