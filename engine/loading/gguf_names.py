"""Where each tensor of a GGUF (as llama.cpp's converter writes it) goes in a Hugging Face
checkpoint, and what the converter did to it that the loader undoes.

llama.cpp names a tensor `blk.N.<part>.weight|bias` (or `token_embd`, `output`,
`output_norm`); the part names are the same across architectures, but a few mean another
Hugging Face module in some families (Gemma 3's `ffn_norm` is the MLP's pre-norm; Phi-3's
`ffn_up` holds gate and up rows; gpt-oss's router is `mlp.router`). What the converter
changed:

- llama-arch files (Llama, Mistral, Mixtral, Granite): the rows of q and k (weights and
  biases) permuted per head, from rotate-half to interleaved pairs (`unpermute_rows`);
- Gemma 3: every norm weight stored as 1 + w (Gemma multiplies by 1 + w; llama.cpp by w);
- mixtures of experts: each layer's experts stacked, `ffn_{gate,up,down}_exps` [E, rows,
  cols] (gpt-oss's fused, interleaved gate_up split into the two);
- rotary settings as tensors: `rope_freqs` (Llama 3's per-frequency factors) and
  `rope_factors_{long,short}` (LongRoPE): read into the config (gguf_config.py), not weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# GGUF architectures whose converter permutes q/k rows (llama.cpp's LlamaModel and its
# subclasses among the families officellm runs).
PERMUTED_QK_ARCHS = ("llama", "granite")
# GGUF architecture -> the Hugging Face model_type officellm runs it as ("llama" with
# `llama.expert_count` is Mixtral: gguf_config.py decides).
ARCH_MODEL_TYPES = {
    "llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss", "gemma3": "gemma3_text", "phi3": "phi3", "granite": "granite",
}

_TOP = {"token_embd": "model.embed_tokens", "output": "lm_head", "output_norm": "model.norm"}
# Tensors that carry settings, not weights (read by gguf_config.py).
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")

_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "ffn_gate_inp": "mlp.gate",
}
# Per model_type: the parts that mean another module than _LAYER says.
_LAYER_OVERRIDES = {
    "gemma3_text": {"ffn_norm": "pre_feedforward_layernorm",
                    "post_attention_norm": "post_attention_layernorm",
                    "post_ffw_norm": "post_feedforward_layernorm"},
    "gpt_oss": {"post_attention_norm": "post_attention_layernorm",
                "ffn_gate_inp": "mlp.router", "attn_sinks": "self_attn.sinks"},
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    "mixtral": {"ffn_gate_inp": "block_sparse_moe.gate"},
}
EXPERT_PARTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@dataclass(frozen=True)
class TensorPlace:
    """One GGUF tensor's place in the Hugging Face checkpoint.

    `name`: the Hugging Face name (for stacked experts, the layer's prefix
    `model.layers.N.` : gguf_checkpoint.py and gguf_tensors.py lay them out per family).
    `part`: llama.cpp's part name (`attn_q`, `ffn_up_exps`, ...); `kind`: weight or bias.
    """

    name: str
    layer: int | None
    part: str
    kind: str

    @property
    def is_experts(self) -> bool:
        return self.part in EXPERT_PARTS


def tensor_place(model_type: str, gguf_name: str) -> TensorPlace | None:
    """Where `gguf_name` goes for a `model_type` checkpoint; None for a tensor that is not a
    weight (the rotary settings) or one no family here has."""
    parts = gguf_name.split(".")
    if gguf_name in ROPE_TENSORS or parts[-1] not in ("weight", "bias"):
        return None
    kind = parts[-1]
    if len(parts) == 2 and parts[0] in _TOP:
        return TensorPlace(f"{_TOP[parts[0]]}.{kind}", None, parts[0], kind)
    if parts[0] != "blk" or len(parts) != 4:
        return None
    layer, part = int(parts[1]), parts[2]
    prefix = f"model.layers.{layer}."
    if part in EXPERT_PARTS:
        return TensorPlace(prefix, layer, part, kind)
    module = _LAYER_OVERRIDES.get(model_type, {}).get(part) or _LAYER.get(part)
    if module is None:
        return None
    if part == "attn_sinks":  # a parameter of its own, not a module's weight
        return TensorPlace(prefix + module, layer, part, kind)
    return TensorPlace(f"{prefix}{module}.{kind}", layer, part, kind)


def permuted_heads(arch: str, part: str, num_heads: int, num_kv_heads: int) -> int | None:
    """The head count whose rows llama.cpp permuted in this tensor, or None."""
    if arch not in PERMUTED_QK_ARCHS:
        return None
    return {"attn_q": num_heads, "attn_k": num_kv_heads}.get(part)


def unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's q/k permutation: within each head, its converter
    moved row i of the first half to 2i and row i of the second half to 2i + 1 (the two
    values rotate-half pairs, made neighbours)."""
    half = rows // heads // 2
    return torch.arange(rows).reshape(heads, half, 2).transpose(1, 2).reshape(-1)
