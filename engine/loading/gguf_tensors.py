"""A GGUF file's quantized matmul weights, as they are stored, under Hugging Face names.

The dequantized copy that model_loader caches serves every other weight (norms, biases) and
any tensor type without a kernel here. What this reads is kept in its blocks: rows of
bytes, one row per output feature, so slicing and concatenating rows (fusing q/k/v, cutting
a tensor-parallel shard of the outputs) never touches a block.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from officellm.engine.loading.gguf_layout import read_layout
from officellm.kernels.reference import quant_reference

logger = logging.getLogger("officellm.engine.loading.gguf_tensors")

# GGUF's per-layer names -> Hugging Face's (Llama, Mistral, SmolLM, Qwen2/3 all use these).
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output": "lm_head"}


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
    unsupported: dict[str, list[str]]  # type name -> the Hugging Face names left dequantized


def read_quantized(path: Path, num_heads: int, num_kv_heads: int) -> GgufWeights:
    """Read the matmul weights of the GGUF at `path` that a kernel can run in their blocks.

    llama.cpp's converter permutes the rows of a Llama's q and k projections (its rotary
    layout); transformers undoes that on load, and so do we, on whole rows of blocks.
    """
    layout = read_layout(path)
    arch = str(layout.metadata.get("general.architecture", ""))
    tensors: dict[str, QuantizedTensor] = {}
    unsupported: dict[str, list[str]] = {}
    for t in layout.tensors:
        name = _hf_name(t.name)
        if name is None:
            continue
        fmt = int(t.tensor_type)
        if fmt not in quant_reference.GROUP_BYTES:
            if t.tensor_type.name not in ("F32", "F16", "BF16"):
                unsupported.setdefault(t.tensor_type.name, []).append(name)
            continue
        rows = t.shape[1] if len(t.shape) > 1 else 1
        data = torch.from_numpy(layout.tensor_bytes(t)).reshape(rows, -1)
        q = QuantizedTensor(fmt, data, t.shape[0])
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = num_heads if "q_proj" in name else num_kv_heads
            q = q.take_rows(_unpermute_rows(q.rows, heads))
        tensors[name] = q
    return GgufWeights(tensors, unsupported)


def _hf_name(gguf_name: str) -> str | None:
    parts = gguf_name.split(".")
    if parts[-1] != "weight":
        return None
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.weight"
    if len(parts) == 2 and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.weight"
    return None


def _unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation (as transformers' loader does)."""
    half = rows // heads // 2
    return torch.arange(rows).reshape(heads, half, 2).transpose(1, 2).reshape(-1)
