"""Architecture facts read from a Hugging Face config.json: what the decoder and `plan` need.

Every family officellm runs is one decoder (engine/models/decoder.py) with features turned
on or off; `SUPPORTED_ARCHITECTURES` says which features each model_type needs. The config is
read through transformers' own config class for its model_type, so a field a checkpoint
leaves out takes the default transformers' model would use, and old and new spellings of the
rope settings, sliding windows and layer types arrive in one form.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from officellm.engine.loading.transformers_lock import TRANSFORMERS

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


@dataclass(frozen=True)
class Family:
    """What one model_type needs of the decoder.

    - qkv_bias / qk_norm: bias on q/k/v (Qwen2); RMSNorm of each q and k head (Qwen3, Gemma 3).
    - norm_offset: RMSNorm weights stored as w - 1 (Gemma: the norm multiplies by 1 + w).
    - sandwich_norms: a norm on the attention's output, and around the MLP (Gemma 3's four
      norms per layer).
    - activation: the MLP's gated activation, "silu" (SwiGLU) or "gelu_tanh" (GeGLU).
    - embed_scale: the embeddings times sqrt(hidden) (Gemma).
    - multipliers: embedding, residual, attention and logit multipliers from the config
      (Granite).
    - sinks: a learned softmax sink per attention head (gpt-oss).
    - moe: the router's convention, for a mixture of experts (see MoESpec.router).
    - layout: how the checkpoint names its weights (engine/models/weight_names.py).
    """

    label: str
    qkv_bias: bool = False
    qk_norm: bool = False
    norm_offset: bool = False
    sandwich_norms: bool = False
    activation: str = "silu"
    embed_scale: bool = False
    multipliers: bool = False
    sinks: bool = False
    moe: str | None = None
    layout: str = "llama"


# model_type -> features. One decoder implementation covers them all.
SUPPORTED_ARCHITECTURES: dict[str, Family] = {
    "llama": Family("Llama, SmolLM"),
    "mistral": Family("Mistral"),
    "qwen2": Family("Qwen2/Qwen2.5", qkv_bias=True),
    "qwen3": Family("Qwen3", qk_norm=True),
    "qwen3_moe": Family("Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder)", qk_norm=True,
                        moe="softmax_topk"),
    "mixtral": Family("Mixtral", moe="softmax_topk", layout="mixtral"),
    "gpt_oss": Family("gpt-oss", qkv_bias=True, sinks=True, moe="topk_softmax",
                      layout="gpt_oss"),
    "gemma3_text": Family("Gemma 3", qk_norm=True, norm_offset=True, sandwich_norms=True,
                          activation="gelu_tanh", embed_scale=True),
    "phi3": Family("Phi-3/Phi-4", layout="phi3"),
    "granite": Family("Granite 3", multipliers=True),
    "qwen2_5_vl_text": Family("Qwen2.5-VL", qkv_bias=True),
}
# Checkpoints whose language model is one of the above inside a multimodal model: the text
# model's model_type, and what is skipped (said once at start-up).
MULTIMODAL_WRAPPERS: dict[str, str] = {"gemma3": "gemma3_text", "qwen2_5_vl": "qwen2_5_vl_text"}


class UnsupportedModelError(ValueError):
    pass


@dataclass(frozen=True)
class RopeSpec:
    """One rotary table's settings: the base, and rope_scaling's dict (None: plain)."""

    theta: float
    scaling: dict[str, Any] | None = None


@dataclass(frozen=True)
class MoESpec:
    """A mixture-of-experts MLP (kernels/reference/moe.py has the arithmetic).

    router: "softmax_topk" (softmax over all experts, then the top k; renormalize divides
    the k weights by their sum: Mixtral always, Qwen3-MoE by norm_topk_prob) or
    "topk_softmax" (the top k logits, then their softmax: gpt-oss). gpt-oss's router and
    experts have biases, and its experts a clamped SwiGLU (activation "clamped_swiglu" with
    alpha and limit). `layers`: the layers whose MLP is the MoE (the others are dense).
    """

    num_experts: int
    top_k: int
    intermediate_size: int
    router: str
    renormalize: bool
    layers: frozenset[int]
    router_bias: bool = False
    expert_bias: bool = False
    activation: str = "silu"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0


@dataclass(frozen=True)
class ModelSpec:
    """The shape and features of one decoder-only transformer."""

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
    # Per layer: FULL_ATTENTION or SLIDING_ATTENTION (empty: every layer full).
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None  # the sliding layers' window, in tokens
    local_rope: RopeSpec | None = None  # the sliding layers' rotary, where it differs (Gemma 3)
    rope_per_layer_type: bool = False  # the config keys its rope settings by layer type
    rotary_dim: int | None = None  # rotated values per head when partial (Phi-4-mini)
    activation: str = "silu"
    norm_offset: bool = False
    sandwich_norms: bool = False
    embedding_multiplier: float | None = None
    residual_multiplier: float = 1.0
    attention_scale: float | None = None  # None: head_dim ** -0.5
    logits_divisor: float = 1.0
    final_logit_softcapping: float | None = None
    attention_sinks: bool = False
    moe: MoESpec | None = None
    layout: str = "llama"
    # How the checkpoint stores its experts' matrices: None (the model's dtype) or "mxfp4"
    # (gpt-oss as shipped: 4-bit values with a shared exponent per 32, kept so when loaded).
    expert_format: str | None = None
    # The checkpoint is a multimodal model's (its model_type): only its language model runs.
    multimodal_wrapper: str | None = None
    # M-RoPE (Qwen2.5-VL): the rotary's frequencies (head_dim / 2 of them) cut into sections
    # turned by a token's temporal, height and width position in turn (engine/models/mrope.py).
    mrope_section: tuple[int, ...] | None = None
    # ... and how many patches of an image's grid, each way, one of its tokens merges.
    mrope_merge_size: int = 1
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_config_dict(cls, cfg: dict[str, Any]) -> ModelSpec:
        """Build from a config.json dict; raise UnsupportedModelError for other architectures."""
        model_type = cfg.get("model_type", "")
        wrapper = None
        outer = cfg
        if model_type in MULTIMODAL_WRAPPERS:
            wrapper, model_type = model_type, MULTIMODAL_WRAPPERS[model_type]
            cfg = {**_text_config(wrapper, cfg), "model_type": model_type}
        if model_type not in SUPPORTED_ARCHITECTURES:
            archs = cfg.get("architectures") or [model_type or "unknown"]
            raise UnsupportedModelError(
                f"Unsupported model architecture {archs[0]!r} (model_type {model_type!r}). "
                f"officellm supports: {', '.join(sorted(SUPPORTED_ARCHITECTURES))} "
                f"({'; '.join(f.label for f in SUPPORTED_ARCHITECTURES.values())}), and "
                f"the language model of {', '.join(sorted(MULTIMODAL_WRAPPERS))} checkpoints."
            )
        family = SUPPORTED_ARCHITECTURES[model_type]
        full = _with_defaults(model_type, cfg)
        heads = full["num_attention_heads"]
        head_dim = full.get("head_dim") or full["hidden_size"] // heads
        num_layers = full["num_hidden_layers"]
        rope = _rope_settings(full)
        global_rope = rope.get(FULL_ATTENTION) or next(iter(rope.values()))
        layer_types, window = _layer_windows(full, num_layers, global_rope)
        local = rope.get(SLIDING_ATTENTION)
        partial = float((global_rope.scaling or {}).get("partial_rotary_factor")
                        or full.get("partial_rotary_factor") or 1.0)
        rotary_dim = int(head_dim * partial) if partial < 1.0 else None
        attn_bias = bool(full.get("attention_bias", False))
        h = full["hidden_size"]
        attention_scale = None
        if model_type == "gemma3_text":
            attention_scale = float(full["query_pre_attn_scalar"]) ** -0.5
        elif family.multipliers:
            attention_scale = float(full.get("attention_multiplier", head_dim ** -0.5))
        embedding_multiplier = None
        if family.embed_scale:
            embedding_multiplier = math.sqrt(h)
        elif family.multipliers:
            embedding_multiplier = float(full.get("embedding_multiplier", 1.0))
        return cls(
            model_type=model_type,
            num_layers=num_layers,
            hidden_size=h,
            intermediate_size=full.get("intermediate_size") or 0,
            num_heads=heads,
            num_kv_heads=full.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            vocab_size=full["vocab_size"],
            rms_norm_eps=full.get("rms_norm_eps", 1e-6),
            max_position_embeddings=full.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(full.get("tie_word_embeddings", False)),
            qkv_bias=family.qkv_bias or attn_bias,
            qk_norm=family.qk_norm,
            o_bias=attn_bias and model_type != "qwen2",  # Qwen2 biases q/k/v only
            mlp_bias=bool(full.get("mlp_bias", False)),
            rope_theta=global_rope.theta,
            rope_scaling=global_rope.scaling,
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            layer_types=layer_types,
            sliding_window=window,
            local_rope=local if local is not None and local != global_rope else None,
            rope_per_layer_type=FULL_ATTENTION in rope or SLIDING_ATTENTION in rope,
            rotary_dim=rotary_dim,
            activation=family.activation,
            norm_offset=family.norm_offset,
            sandwich_norms=family.sandwich_norms,
            embedding_multiplier=embedding_multiplier,
            residual_multiplier=(float(full.get("residual_multiplier", 1.0))
                                 if family.multipliers else 1.0),
            attention_scale=attention_scale,
            logits_divisor=(float(full.get("logits_scaling", 1.0))
                            if family.multipliers else 1.0),
            final_logit_softcapping=full.get("final_logit_softcapping"),
            attention_sinks=family.sinks,
            moe=_moe_spec(family, full, num_layers),
            layout=family.layout,
            expert_format=_expert_format(cfg),
            multimodal_wrapper=wrapper,
            mrope_section=_mrope_section(full),
            mrope_merge_size=_mrope_merge_size(outer) if _mrope_section(full) else 1,
            raw=cfg,
        )

    @classmethod
    def from_json(cls, path: str | Path) -> ModelSpec:
        return cls.from_config_dict(json.loads(Path(path).read_text()))

    # -- per layer -----------------------------------------------------------------------
    def layer_window(self, layer: int) -> int | None:
        """The layer's sliding window in tokens, or None for full attention."""
        if self.layer_types and self.layer_types[layer] == SLIDING_ATTENTION:
            return self.sliding_window
        return None

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        return tuple(self.layer_window(i) for i in range(self.num_layers))

    def layer_rope(self, layer: int) -> RopeSpec:
        """The rotary settings the layer's q and k use."""
        if self.local_rope is not None and self.layer_window(layer) is not None:
            return self.local_rope
        return RopeSpec(self.rope_theta, self.rope_scaling)

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer in self.moe.layers

    @property
    def long_context_after(self) -> int | None:
        """LongRoPE (Phi-3/Phi-4-mini): a sequence longer than this many tokens (the
        original window) is rotated with the long factors, all of it; transformers
        recomputes a sequence's cache when it first grows past it. None for other ropes."""
        scaling = self.rope_scaling or {}
        if scaling.get("rope_type") != "longrope":
            return None
        original = int(scaling.get("original_max_position_embeddings")
                       or self.raw.get("original_max_position_embeddings")
                       or self.max_position_embeddings)
        return original if original < self.max_position_embeddings else None

    @property
    def scale(self) -> float:
        """The attention's softmax scale."""
        return self.attention_scale if self.attention_scale is not None else self.head_dim ** -0.5

    # -- sizes ---------------------------------------------------------------------------
    def kv_bytes_per_token(self, dtype_bytes: int, tensor_parallel_size: int = 1,
                           scale_bytes: int = 0) -> int:
        """2 (K and V) x layers x kv_heads x (head_dim x dtype bytes + scale bytes) (per rank
        under TP): what a token costs while every layer holds it (a sliding layer lets go of
        the tokens its window has passed: engine/core/kv_cache_groups.py counts that);
        scale_bytes: what each stored row of head_dim values carries besides them (an int8
        cache's float32 scale)."""
        kv_heads = max(1, -(-self.num_kv_heads // tensor_parallel_size))
        return 2 * self.num_layers * kv_heads * (self.head_dim * dtype_bytes + scale_bytes)

    def num_parameters(self) -> int:
        """Parameter count computed from the shapes (embeddings counted once when tied;
        every expert of a mixture counted)."""
        return self._parameters(active_only=False)

    def num_active_parameters(self) -> int:
        """The parameters one token's forward reads: a mixture's routed experts only."""
        return self._parameters(active_only=True)

    def _parameters(self, active_only: bool) -> int:
        h, v = self.hidden_size, self.vocab_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        attn = h * (q + 2 * kv) + q * h
        if self.qkv_bias:
            attn += q + 2 * kv
        if self.o_bias:
            attn += h
        if self.qk_norm:
            attn += 2 * self.head_dim
        if self.attention_sinks:
            attn += self.num_heads
        norms = (4 if self.sandwich_norms else 2) * h
        total = 0
        for layer in range(self.num_layers):
            total += attn + norms + self._mlp_parameters(layer, active_only)
        emb = v * h
        head = 0 if self.tie_word_embeddings else v * h
        return total + emb + head + h

    def _mlp_parameters(self, layer: int, active_only: bool) -> int:
        h = self.hidden_size
        moe = self.moe
        if moe is None or layer not in moe.layers:
            i = self.intermediate_size
            return 3 * h * i + ((2 * i + h) if self.mlp_bias else 0)
        i = moe.intermediate_size
        experts = moe.top_k if active_only else moe.num_experts
        per_expert = 3 * h * i + ((2 * i + h) if moe.expert_bias else 0)
        router = moe.num_experts * h + (moe.num_experts if moe.router_bias else 0)
        return experts * per_expert + router


def check_architecture(cfg: dict[str, Any]) -> None:
    """Raise UnsupportedModelError, with the sentence naming what officellm runs, unless the
    config.json dict is of an architecture the decoder runs."""
    ModelSpec.from_config_dict(cfg)


def _expert_format(cfg: dict[str, Any]) -> str | None:
    quant = cfg.get("quantization_config") or {}
    return "mxfp4" if quant.get("quant_method") == "mxfp4" else None


def _text_config(wrapper: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config of a multimodal checkpoint, with transformers' defaults
    for what it leaves out."""
    with TRANSFORMERS:
        from transformers import AutoConfig

        raw = {k: v for k, v in cfg.items() if k not in ("model_type", "transformers_version")}
        text = AutoConfig.for_model(wrapper, **raw).text_config.to_dict()
        for key in ("torch_dtype", "dtype", "tie_word_embeddings"):
            if key in cfg and key not in text:
                text[key] = cfg[key]
        return text


def _with_defaults(model_type: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """cfg as transformers' config class for model_type reads it: its defaults for the fields
    the file leaves out, rope settings in `rope_parameters`, `layer_types` where the family
    has them. The file's own values win where both are given."""
    with TRANSFORMERS:
        from transformers import AutoConfig

        raw = {k: v for k, v in cfg.items() if k not in ("model_type", "transformers_version")}
        normalized = AutoConfig.for_model(model_type, **raw).to_dict()
        return {**normalized, **{k: v for k, v in cfg.items() if k not in normalized}}


def _rope_settings(cfg: dict[str, Any]) -> dict[str, RopeSpec]:
    """Rotary settings per layer type (one entry, keyed "", for a model with one table)."""
    params = cfg.get("rope_parameters")
    if params is None:  # an old spelling transformers did not fold
        params = {**(cfg.get("rope_scaling") or {}), "rope_theta": cfg.get("rope_theta", 1e4)}
    if params and all(isinstance(v, dict) or v is None for v in params.values()):
        return {kind: _rope_spec(p) for kind, p in params.items() if p is not None}
    return {"": _rope_spec(params)}


def _mrope_section(cfg: dict[str, Any]) -> tuple[int, ...] | None:
    """M-RoPE's sections (transformers keeps them in the rope settings, its rope type then
    "default": the frequencies themselves are a plain table's)."""
    section = (cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}).get("mrope_section")
    return tuple(int(s) for s in section) if section else None


def _mrope_merge_size(cfg: dict[str, Any]) -> int:
    """The vision tower's spatial merge (Qwen2.5-VL's 2: a token per 2x2 patches), with
    transformers' default where the file leaves it out."""
    with TRANSFORMERS:
        from transformers import AutoConfig

        raw = {k: v for k, v in cfg.items() if k not in ("model_type", "transformers_version")}
        return int(AutoConfig.for_model(cfg["model_type"], **raw).vision_config.spatial_merge_size)


def _rope_spec(params: dict[str, Any]) -> RopeSpec:
    scaling = dict(params)
    theta = float(scaling.pop("rope_theta", None) or 10000.0)
    rtype = scaling.get("rope_type") or scaling.get("type") or "default"
    scaling["rope_type"] = rtype
    if rtype == "default":
        # A partial rotary factor is the only thing a default table needs to keep.
        partial = scaling.get("partial_rotary_factor")
        return RopeSpec(theta, {"rope_type": "default", "partial_rotary_factor": partial}
                        if partial not in (None, 1.0) else None)
    return RopeSpec(theta, scaling)


def _layer_windows(cfg: dict[str, Any], num_layers: int, rope: RopeSpec
                   ) -> tuple[tuple[str, ...], int | None]:
    """(layer types, the sliding window): from `layer_types` where the config has them, else
    every layer sliding when a `sliding_window` is set (Mistral, Phi-3, Mixtral). A window as
    long as the model's whole context slides nothing: every layer is then full."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if window is None or window <= 0:
        return (), None
    factor = (rope.scaling or {}).get("factor") or 1.0
    if window >= cfg.get("max_position_embeddings", 2048) * max(1.0, float(factor)):
        return (), None
    if types is None:
        if cfg.get("use_sliding_window") is False:
            return (), None
        types = [SLIDING_ATTENTION] * num_layers
    types = tuple(types)
    if len(types) != num_layers or set(types) - {FULL_ATTENTION, SLIDING_ATTENTION}:
        raise UnsupportedModelError(f"layer_types {list(types)} of a {num_layers}-layer model: "
                                    f"officellm runs {FULL_ATTENTION} and {SLIDING_ATTENTION}.")
    if SLIDING_ATTENTION not in types:
        return (), None
    return types, int(window)


def _moe_spec(family: Family, cfg: dict[str, Any], num_layers: int) -> MoESpec | None:
    if family.moe is None:
        return None
    num_experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if family.moe == "topk_softmax":  # gpt-oss: every layer, biases, clamped SwiGLU
        return MoESpec(num_experts, cfg["num_experts_per_tok"], cfg["intermediate_size"],
                       "topk_softmax", False, frozenset(range(num_layers)), router_bias=True,
                       expert_bias=True, activation="clamped_swiglu",
                       swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)),
                       swiglu_limit=float(cfg.get("swiglu_limit", 7.0)))
    if "moe_intermediate_size" in cfg:  # Qwen3-MoE: some layers may stay dense
        step = cfg.get("decoder_sparse_step") or 1
        dense = set(cfg.get("mlp_only_layers") or ())
        layers = frozenset(i for i in range(num_layers)
                           if i not in dense and (i + 1) % step == 0)
        return MoESpec(num_experts, cfg["num_experts_per_tok"], cfg["moe_intermediate_size"],
                       "softmax_topk", bool(cfg.get("norm_topk_prob", False)), layers)
    # Mixtral: every layer, renormalized top-k.
    return MoESpec(num_experts, cfg["num_experts_per_tok"], cfg["intermediate_size"],
                   "softmax_topk", True, frozenset(range(num_layers)))
