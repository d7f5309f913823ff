"""Architecture facts read from a Hugging Face config.json: what the decoder and `plan` need."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# model_type -> features. One decoder implementation covers them all.
SUPPORTED_ARCHITECTURES: dict[str, dict[str, bool]] = {
    "llama": {"qkv_bias": False, "qk_norm": False},
    "mistral": {"qkv_bias": False, "qk_norm": False},
    "qwen2": {"qkv_bias": True, "qk_norm": False},
    "qwen3": {"qkv_bias": False, "qk_norm": True},
}


class UnsupportedModelError(ValueError):
    pass


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer of the Llama family."""

    model_type: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    o_bias: bool = False
    mlp_bias: bool = False
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    torch_dtype: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_config_dict(cls, cfg: dict[str, Any]) -> ModelSpec:
        """Build from a config.json dict; raise UnsupportedModelError for other architectures."""
        model_type = cfg.get("model_type", "")
        if model_type not in SUPPORTED_ARCHITECTURES:
            archs = cfg.get("architectures") or [model_type or "unknown"]
            raise UnsupportedModelError(
                f"Unsupported model architecture {archs[0]!r} (model_type {model_type!r}). "
                f"officellm supports: {', '.join(sorted(SUPPORTED_ARCHITECTURES))} "
                "(Llama, Mistral, SmolLM, Qwen2/Qwen2.5, Qwen3)."
            )
        feats = SUPPORTED_ARCHITECTURES[model_type]
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        # transformers 5 keeps rope settings in rope_parameters; 4.x in rope_theta/rope_scaling.
        rope_params = dict(cfg.get("rope_parameters") or {})
        rope_theta = rope_params.pop("rope_theta", None) or cfg.get("rope_theta") or 10000.0
        scaling = cfg.get("rope_scaling") or rope_params or None
        if scaling:
            scaling = dict(scaling)
            rtype = scaling.get("rope_type") or scaling.get("type") or "default"
            scaling["rope_type"] = rtype
            if rtype == "default":
                scaling = None
        attn_bias = bool(cfg.get("attention_bias", False))
        return cls(
            model_type=model_type,
            num_layers=cfg["num_hidden_layers"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            vocab_size=cfg["vocab_size"],
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=feats["qkv_bias"] or attn_bias,
            qk_norm=feats["qk_norm"],
            o_bias=attn_bias and model_type == "llama",
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            rope_theta=float(rope_theta),
            rope_scaling=scaling,
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            raw=cfg,
        )

    @classmethod
    def from_json(cls, path: str | Path) -> ModelSpec:
        return cls.from_config_dict(json.loads(Path(path).read_text()))

    def kv_bytes_per_token(self, dtype_bytes: int, tensor_parallel_size: int = 1,
                           scale_bytes: int = 0) -> int:
        """2 (K and V) x layers x kv_heads x (head_dim x dtype bytes + scale bytes) (per rank
        under TP); scale_bytes: what each stored row of head_dim values carries besides them
        (an int8 cache's float32 scale)."""
        kv_heads = max(1, -(-self.num_kv_heads // tensor_parallel_size))
        return 2 * self.num_layers * kv_heads * (self.head_dim * dtype_bytes + scale_bytes)

    def num_parameters(self) -> int:
        """Parameter count computed from the shapes (embeddings counted once when tied)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        attn = h * (q + 2 * kv) + q * h
        if self.qkv_bias:
            attn += q + 2 * kv
        if self.qk_norm:
            attn += 2 * self.head_dim
        mlp = 3 * h * i
        per_layer = attn + mlp + 2 * h
        emb = v * h
        head = 0 if self.tie_word_embeddings else v * h
        return self.num_layers * per_layer + emb + head + h
