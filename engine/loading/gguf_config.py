"""A GGUF's Hugging Face config: llama.cpp's metadata keys (`{arch}.embedding_length`, ...)
read back into the config.json fields of the family's own config class.

What each architecture's converter writes (llama.cpp's conversion/*.py) and what llama.cpp
assumes at run time where the file says nothing:

- llama: Llama, Mistral, SmolLM, Granite-free; with `llama.expert_count` it is Mixtral.
  Llama 3's rope scaling is stored as per-frequency factors (`rope_freqs`), not settings:
  `_llama3_rope` finds settings that give the same factors.
- qwen3moe: every layer with a router (`ffn_gate_inp`) is a mixture, the others dense; the
  top-k weights are renormalized (llama.cpp always does for this architecture).
- gpt-oss: sliding and full layers alternate, the first sliding; YaRN without truncation.
- gemma3: no layer pattern is written: llama.cpp makes every sixth layer global (Gemma 3's
  pattern), the sliding ones rotate with base 10,000 unless the file says otherwise; the
  attention scales by head_dim ** -0.5 (hidden / heads for the 62-layer 27B).
- phi3: a partial rotary (`rope.dimension_count` of head_dim) and LongRoPE factors as
  tensors; `attention.sliding_window` 0 means none.
- granite: Llama's keys plus four multipliers (`attention.scale`, `embedding_scale`,
  `residual_scale`, `logit_scale`).

Floats are stored as float32: each is read back as the shortest decimal that rounds to
the same float32 (1e-05, not 9.999999747e-06), what the original config most likely held.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from officellm.engine.loading.gguf_layout import GgufLayout, GgufTensorInfo
from officellm.engine.loading.gguf_names import ARCH_MODEL_TYPES
from officellm.engine.loading.model_spec import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    UnsupportedModelError,
)

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM", "gpt_oss": "GptOssForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM",
    "granite": "GraniteForCausalLM",
}
GEMMA3_PATTERN = 6  # llama.cpp's Gemma 3: five sliding layers, then a global one
GEMMA3_LOCAL_BASE = 10000.0
GEMMA3_27B_LAYERS = 62


def short_float(value: float) -> float:
    """The shortest decimal that rounds to the same float32 as `value`."""
    return float(str(np.float32(value)))


class _Metadata:
    """One file's `{arch}.` keys."""

    def __init__(self, layout: GgufLayout, arch: str) -> None:
        self.values = layout.metadata
        self.arch = arch

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(f"{self.arch}.{key}", default)

    def number(self, key: str, default: float | None = None) -> float | None:
        value = self.get(key)
        return default if value is None else short_float(value)


def model_type_of(layout: GgufLayout) -> str:
    """The Hugging Face model_type a GGUF runs as; UnsupportedModelError for an architecture
    no family here has."""
    arch = str(layout.metadata.get("general.architecture", ""))
    if arch not in ARCH_MODEL_TYPES:
        raise UnsupportedModelError(
            f"Unsupported GGUF architecture {arch!r}. officellm reads GGUF files of: "
            f"{', '.join(sorted(ARCH_MODEL_TYPES))}.")
    if arch == "llama" and (layout.metadata.get("llama.expert_count") or 0) > 0:
        return "mixtral"
    return ARCH_MODEL_TYPES[arch]


def hf_config(layout: GgufLayout) -> dict[str, Any]:
    """The config.json dict of the GGUF's model, in its family's own field names."""
    model_type = model_type_of(layout)
    arch = str(layout.metadata["general.architecture"])
    meta = _Metadata(layout, arch)
    tensors = {t.name: t for t in layout.tensors}
    heads = int(meta.get("attention.head_count"))
    hidden = int(meta.get("embedding_length"))
    embedding = tensors["token_embd.weight"]
    cfg: dict[str, Any] = {
        "model_type": model_type,
        "architectures": [_ARCHITECTURES[model_type]],
        "hidden_size": hidden,
        "num_hidden_layers": int(meta.get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("attention.head_count_kv", heads)),
        "max_position_embeddings": int(meta.get("context_length", 2048)),
        "rms_norm_eps": meta.number("attention.layer_norm_rms_epsilon", 1e-6),
        "vocab_size": embedding.shape[1],
        "tie_word_embeddings": "output.weight" not in tensors,
        "rope_theta": meta.number("rope.freq_base", 10000.0),
        "torch_dtype": "float32",
    }
    if meta.get("feed_forward_length") is not None:
        cfg["intermediate_size"] = int(meta.get("feed_forward_length"))
    head_dim = meta.get("attention.key_length")
    if head_dim is not None:
        cfg["head_dim"] = int(head_dim)
    for key, field in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                       ("padding_token_id", "pad_token_id")):
        value = layout.metadata.get(f"tokenizer.ggml.{key}")
        if value is not None:
            cfg[field] = int(value)  # type: ignore[call-overload]
    if "blk.0.attn_q.bias" in tensors:
        cfg["attention_bias"] = True
    if "blk.0.ffn_down.bias" in tensors:
        cfg["mlp_bias"] = True
    scaling = _rope_scaling(layout, meta, tensors)
    if scaling is not None:
        cfg["rope_scaling"] = scaling
    _FAMILY_FIELDS[model_type](cfg, meta, tensors, layout)
    return cfg


# -- per family --------------------------------------------------------------------------

def _llama(cfg: dict, meta: _Metadata, tensors: dict, layout: GgufLayout) -> None:
    if "head_dim" not in cfg and meta.get("rope.dimension_count") is not None:
        cfg["head_dim"] = int(meta.get("rope.dimension_count"))
    freqs = tensors.get("rope_freqs.weight")
    if freqs is not None:
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        cfg["rope_scaling"] = _llama3_rope(_floats(layout, freqs), cfg["rope_theta"], head_dim)


def _mixtral(cfg: dict, meta: _Metadata, tensors: dict, layout: GgufLayout) -> None:
    _llama(cfg, meta, tensors, layout)
    cfg["num_local_experts"] = int(meta.get("expert_count"))
    cfg["num_experts_per_tok"] = int(meta.get("expert_used_count"))
    cfg["sliding_window"] = None


def _qwen2(cfg: dict, meta: _Metadata, tensors: dict, layout: GgufLayout) -> None:
    cfg.pop("attention_bias", None)  # Qwen2's q/k/v always carry biases
    cfg["use_sliding_window"] = False


def _qwen3(cfg: dict, meta: _Metadata, tensors: dict, layout: GgufLayout) -> None:
    cfg.setdefault("attention_bias", False)


def _qwen3_moe(cfg: dict, meta: _Metadata, tensors: dict, layout: GgufLayout) -> None:
    _qwen3(cfg, meta, tensors, layout)
    cfg["num_experts"] = int(meta.get("expert_count"))
    cfg["num_experts_per_tok"] = int(meta.get("expert_used_count"))
    cfg["moe_intermediate_size"] = int(meta.get("expert_feed_forward_length"))
    cfg["norm_topk_prob"] = bool(meta.get("expert_weights_norm", True))
    cfg["decoder_sparse_step"] = 1
    cfg["mlp_only_layers"] = [i for i in range(cfg["num_hidden_layers"])
                              if f"blk.{i}.ffn_gate_inp.weight" not in tensors]


def _gpt_oss(cfg: dict, meta: _Metadata, tensors: dict, layout: GgufLayout) -> None:
    cfg["num_local_experts"] = int(meta.get("expert_count"))
    cfg["num_experts_per_tok"] = int(meta.get("expert_used_count"))
    cfg["intermediate_size"] = int(meta.get("expert_feed_forward_length",
                                            cfg.get("intermediate_size")))
    cfg["attention_bias"] = True
    window = meta.get("attention.sliding_window")
    cfg["sliding_window"] = int(window) if window else None
    cfg["layer_types"] = [SLIDING_ATTENTION if i % 2 == 0 and window else FULL_ATTENTION
                          for i in range(cfg["num_hidden_layers"])]
    if cfg.get("rope_scaling", {}).get("rope_type") == "yarn":
        cfg["rope_scaling"]["truncate"] = False  # gpt-oss's YaRN, as its config says


def _gemma3(cfg: dict, meta: _Metadata, tensors: dict, layout: GgufLayout) -> None:
    layers = cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    cfg["head_dim"] = head_dim
    scale = meta.number("attention.scale")
    if scale is not None:
        cfg["query_pre_attn_scalar"] = short_float(scale ** -2)
    elif layers == GEMMA3_27B_LAYERS:
        cfg["query_pre_attn_scalar"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    else:
        cfg["query_pre_attn_scalar"] = head_dim
    window = meta.get("attention.sliding_window")
    cfg["sliding_window"] = int(window) if window else None
    cfg["layer_types"] = [SLIDING_ATTENTION if window and (i + 1) % GEMMA3_PATTERN
                          else FULL_ATTENTION for i in range(layers)]
    cfg["rope_local_base_freq"] = meta.number("rope.freq_base_swa", GEMMA3_LOCAL_BASE)
    cfg["final_logit_softcapping"] = meta.number("final_logit_softcapping")
    cfg["attn_logit_softcapping"] = None
    cfg["hidden_activation"] = "gelu_pytorch_tanh"


def _phi3(cfg: dict, meta: _Metadata, tensors: dict, layout: GgufLayout) -> None:
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    rope_dims = meta.get("rope.dimension_count")
    if rope_dims is not None and int(rope_dims) != head_dim:
        cfg["partial_rotary_factor"] = int(rope_dims) / head_dim
    original = meta.get("rope.scaling.original_context_length")
    if original is not None:
        cfg["original_max_position_embeddings"] = int(original)
    window = meta.get("attention.sliding_window")
    cfg["sliding_window"] = int(window) if window else None
    long, short = tensors.get("rope_factors_long.weight"), tensors.get("rope_factors_short.weight")
    if long is not None and short is not None:
        cfg["rope_scaling"] = {"rope_type": "longrope", "long_factor": _floats(layout, long),
                               "short_factor": _floats(layout, short)}


def _granite(cfg: dict, meta: _Metadata, tensors: dict, layout: GgufLayout) -> None:
    for key, field in (("attention.scale", "attention_multiplier"),
                       ("embedding_scale", "embedding_multiplier"),
                       ("residual_scale", "residual_multiplier"),
                       ("logit_scale", "logits_scaling")):
        value = meta.number(key)
        if value is not None:
            cfg[field] = value


_FAMILY_FIELDS = {
    "llama": _llama, "mixtral": _mixtral, "qwen2": _qwen2, "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe, "gpt_oss": _gpt_oss, "gemma3_text": _gemma3, "phi3": _phi3,
    "granite": _granite,
}


# -- rotary ------------------------------------------------------------------------------

def _rope_scaling(layout: GgufLayout, meta: _Metadata, tensors: dict) -> dict | None:
    """rope_scaling from `rope.scaling.*` (linear, YaRN); LongRoPE and Llama 3's factors come
    from tensors (the family functions)."""
    kind = meta.get("rope.scaling.type")
    factor = meta.number("rope.scaling.factor")
    if kind == "linear" and factor:
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn" and factor:
        scaling = {"rope_type": "yarn", "factor": factor,
                   "original_max_position_embeddings":
                       int(meta.get("rope.scaling.original_context_length"))}
        for key, field in (("rope.scaling.yarn_beta_fast", "beta_fast"),
                           ("rope.scaling.yarn_beta_slow", "beta_slow"),
                           ("rope.scaling.yarn_attn_factor", "attention_factor")):
            value = meta.number(key)
            if value is not None:
                scaling[field] = value
        return scaling
    return None


def _floats(layout: GgufLayout, info: GgufTensorInfo) -> list[float]:
    values = layout.tensor_bytes(info).view(np.float32)
    return [short_float(v) for v in values]


def _llama3_rope(factors: list[float], theta: float, head_dim: int) -> dict[str, Any]:
    """Llama 3 rope settings whose factors are `factors` (llama.cpp divides each frequency by
    its factor; transformers computes the same division from the settings).

    The factors are 1 for frequencies whose wavelength is under original / high_freq_factor,
    `factor` above original / low_freq_factor, and 1 / ((1 - s) / factor + s) between, s
    linear in 1 / wavelength. With low_freq_factor 1 (every Llama 3's), two factors between
    fix original and high_freq_factor; with fewer, any band edges that put each wavelength
    in its band give the same factors: the edges are placed halfway (geometrically).
    """
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    wavelengths = 2 * math.pi / freqs
    f = np.asarray(factors, dtype=np.float64)
    factor = float(f.max())
    if factor <= 1.0:
        return {"rope_type": "default"}
    high = wavelengths[np.isclose(f, 1.0, rtol=1e-6)]
    low = wavelengths[np.isclose(f, factor, rtol=1e-6)]
    between = ~(np.isclose(f, 1.0, rtol=1e-6) | np.isclose(f, factor, rtol=1e-6))
    # s = (original / wavelength - 1) / (high_freq_factor - 1) for the factors between.
    s = (1.0 / f[between] - 1.0 / factor) / (1.0 - 1.0 / factor)
    inv = 1.0 / wavelengths[between]
    upper = low.min() if low.size else wavelengths.max() * 2  # original < every low wavelength
    lower = high.max() if high.size else wavelengths.min() / 2  # original / hff > every high one
    if inv.size >= 2:
        slope, intercept = np.polyfit(inv, s, 1)  # s = (original / (hff - 1)) inv - 1 / (hff - 1)
        high_freq = 1.0 - 1.0 / intercept
        original = slope * (high_freq - 1.0)
    elif inv.size == 1:
        original = math.sqrt(upper * (1.0 / inv[0]))  # between the lone wavelength and the low band
        high_freq = 1.0 + (original * inv[0] - 1.0) / s[0]
    else:
        original = math.sqrt(upper * lower)
        high_freq = math.sqrt(original / lower)
    return {"rope_type": "llama3", "factor": short_float(factor), "low_freq_factor": 1.0,
            "high_freq_factor": _round(high_freq), "original_max_position_embeddings":
            int(round(original))}


def _round(value: float) -> float:
    """Six significant digits: a fit's float noise off a config's round number."""
    return float(f"{value:.6g}")
