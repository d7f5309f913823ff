"""Tiny random-weight models built from transformers' config classes, saved as safetensors."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from filelock import FileLock


def _common(vocab: int, layers: int) -> dict:
    return dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
        rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )


# The families added for the models offices run in 2026, each a scaled-down copy of a real
# config (its head-dim ratios, rope, window pattern and routing rule); see tiny_config.
NEW_FAMILIES = ("qwen3_moe", "mixtral", "gpt_oss", "gemma3_text", "phi3", "granite")
# The window of the sliding-window tiny models: shorter than every test prompt.
TINY_WINDOW = 16


def tiny_config(kind: str, vocab: int, layers: int = 3, overrides: dict | None = None):
    """A GQA config (8 query heads over 2 KV heads, 3 layers unless told) of the given family,
    with `overrides`' fields changed (e.g. wider layers, another layer pattern).

    The newer families copy a real model's shape, scaled down:
    - qwen3_moe: Qwen3-30B-A3B (head_dim twice hidden / heads, q/k norms, 8 experts of
      which 2 per token, softmax-then-top-k renormalized);
    - mixtral: Mixtral-8x7B (8 experts, top 2);
    - gpt_oss: gpt-oss-20b (alternating 16-token sliding and full layers, sinks, biases,
      YaRN rope, 8 experts top 4 scored top-k-then-softmax, clamped SwiGLU);
    - gemma3_text: Gemma 3 4B (sliding, sliding, global, sliding with a 16-token window;
      the global layers' rope linearly scaled, the sliding ones' base 10,000; GeGLU;
      query_pre_attn_scalar; four norms; tied embeddings scaled by sqrt(hidden));
    - phi3: Phi-4-mini (partial rotary 3/4, LongRoPE with a 64-token original window,
      24:8 heads as 6:2, tied embeddings);
    - granite: Granite 3.x 8B (its embedding, residual, attention and logit multipliers).
    """
    config = _family_config(kind, vocab, layers)
    if not overrides:
        return config
    return type(config)(**{**config.to_dict(), **overrides})


def _family_config(kind: str, vocab: int, layers: int):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    c = _common(vocab, layers)
    if kind in NEW_FAMILIES:
        return _new_family_config(kind, vocab, layers)
    if kind == "llama":
        return LlamaConfig(**c, head_dim=8, tie_word_embeddings=False, rope_theta=500000.0,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 128})
    if kind == "qwen2":
        return Qwen2Config(**c, tie_word_embeddings=True, rope_theta=1000000.0)
    if kind == "qwen3":
        return Qwen3Config(**c, head_dim=16, tie_word_embeddings=False, rope_theta=1000000.0,
                           attention_bias=False)
    raise ValueError(kind)


def _new_family_config(kind: str, vocab: int, layers: int):
    from transformers import AutoConfig

    base = dict(vocab_size=vocab, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
                pad_token_id=2)
    if kind == "qwen3_moe":
        return AutoConfig.for_model(
            kind, **base, hidden_size=64, num_hidden_layers=layers, num_attention_heads=8,
            num_key_value_heads=2, head_dim=16, intermediate_size=128, moe_intermediate_size=32,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
            mlp_only_layers=[], rms_norm_eps=1e-6, rope_theta=1000000.0,
            tie_word_embeddings=False)
    if kind == "mixtral":
        return AutoConfig.for_model(
            kind, **base, hidden_size=64, num_hidden_layers=layers, num_attention_heads=8,
            num_key_value_heads=2, intermediate_size=96, num_local_experts=8,
            num_experts_per_tok=2, rms_norm_eps=1e-5, rope_theta=1000000.0,
            sliding_window=None, tie_word_embeddings=False)
    if kind == "gpt_oss":
        return AutoConfig.for_model(
            kind, **base, hidden_size=64, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=1, head_dim=16, intermediate_size=64, num_local_experts=8,
            num_experts_per_tok=4, sliding_window=TINY_WINDOW,
            layer_types=["sliding_attention", "full_attention"] * 2, attention_bias=True,
            rms_norm_eps=1e-5, swiglu_limit=7.0, tie_word_embeddings=False,
            rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                          "beta_slow": 1.0, "original_max_position_embeddings": 32,
                          "truncate": False},
            rope_theta=150000.0)
    if kind == "gemma3_text":
        return AutoConfig.for_model(
            kind, **base, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
            intermediate_size=128, sliding_window=TINY_WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention",
                         "sliding_attention"],
            rope_theta=1000000.0, rope_local_base_freq=10000.0,
            rope_scaling={"rope_type": "linear", "factor": 8.0}, rms_norm_eps=1e-6,
            hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
            final_logit_softcapping=None, attn_logit_softcapping=None)
    if kind == "phi3":
        return AutoConfig.for_model(
            kind, **{**base, "max_position_embeddings": 512}, hidden_size=96,
            num_hidden_layers=layers, num_attention_heads=6, num_key_value_heads=2,
            intermediate_size=128, partial_rotary_factor=0.75, rope_theta=10000.0,
            original_max_position_embeddings=64,
            rope_scaling={"type": "longrope",
                          "short_factor": [1.0, 1.1, 1.25, 1.5, 2.0, 3.0],
                          "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0]},
            rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=True)
    if kind == "granite":
        return AutoConfig.for_model(
            kind, **base, hidden_size=64, num_hidden_layers=layers, num_attention_heads=8,
            num_key_value_heads=2, intermediate_size=128, embedding_multiplier=12.0,
            residual_multiplier=0.22, attention_multiplier=0.125, logits_scaling=16.0,
            rms_norm_eps=1e-5, rope_theta=10000000.0, tie_word_embeddings=True)
    raise ValueError(kind)


def tiny_gemma3_multimodal_config(vocab: int, image_size: int = 28, mm_tokens_per_image: int = 1):
    """A Gemma 3 image-text checkpoint's config: the gemma3_text tiny model's language model,
    beside a one-layer SigLIP vision tower (14-pixel patches of `image_size`-pixel images)
    and its projector (pooled to `mm_tokens_per_image` tokens an image)."""
    from transformers import AutoConfig

    text = _new_family_config("gemma3_text", vocab, 4).to_dict()
    for key in ("model_type", "transformers_version", "architectures"):
        text.pop(key, None)
    return AutoConfig.for_model(
        "gemma3", text_config=text,
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, image_size=image_size, patch_size=14),
        mm_tokens_per_image=mm_tokens_per_image, image_token_index=vocab - 1,
        boi_token_index=vocab - 3,
        eoi_token_index=vocab - 2)


# Gemma 3's preprocessor_config.json (google/gemma-3-4b-it's), its image size made the tiny
# tower's: what AutoImageProcessor reads beside a vision checkpoint.
GEMMA3_IMAGE_PROCESSOR = {
    "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True,
    "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 256,
    "pan_and_scan_max_num_crops": None, "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None, "processor_class": "Gemma3Processor",
    "resample": 2, "rescale_factor": 0.00392156862745098, "size": {"height": 896, "width": 896},
}


def build_tiny_gemma3_vision(out_dir: Path, tokenizer_dir: Path, image_size: int = 56,
                             mm_tokens_per_image: int = 4, seed: int = 0) -> Path:
    """A random-weight Gemma 3 image-text checkpoint (tiny_gemma3_multimodal_config's) with its
    image processor's config: a vision model the engine serves images to."""
    import json

    build_tiny_model("gemma3", out_dir, tokenizer_dir, seed, gemma3_vision=(
        image_size, mm_tokens_per_image))
    config = {**GEMMA3_IMAGE_PROCESSOR, "image_seq_length": mm_tokens_per_image,
              "size": {"height": image_size, "width": image_size}}
    (out_dir / "preprocessor_config.json").write_text(json.dumps(config, indent=2))
    return out_dir


def build_tiny_model(kind: str, out_dir: Path, tokenizer_dir: Path, seed: int = 0,
                     layers: int = 3, overrides: dict | None = None,
                     gemma3_vision: tuple[int, int] = (28, 1)) -> Path:
    """Save a random-weight model of `kind` (`layers` deep, tiny_config's `overrides`) with
    the tokenizer of `tokenizer_dir`; `gemma3_vision`: the gemma3 kind's image size and
    tokens per image."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    torch.manual_seed(seed)
    if kind == "gemma3":
        from transformers import Gemma3ForConditionalGeneration

        model = Gemma3ForConditionalGeneration(
            tiny_gemma3_multimodal_config(len(tok), *gemma3_vision))
    else:
        cfg = tiny_config(kind, len(tok), layers, overrides)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # Larger weights than the default init give peaked, decisive distributions, so greedy
    # parity is about the engine, not about ties between near-uniform logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # matrices, and stacked experts
                p.normal_(0.0, 0.2 if "embed" in name or "lm_head" in name else 0.08)
            elif name.endswith("sinks"):
                p.normal_(0.0, 1.0)  # of the scores' size, so the sink changes the answer
            elif "norm" not in name:
                p.normal_(0.0, 0.05)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tok.save_pretrained(str(out_dir))
    for extra in ("generation_config.json",):
        src = tokenizer_dir / extra
        if src.is_file() and not (out_dir / extra).exists():
            shutil.copy(src, out_dir / extra)
    return out_dir


def shared_tiny_model(kind: str, tmp_path_factory: pytest.TempPathFactory,
                      tokenizer_dir: Path, layers: int = 3) -> Path:
    """build_tiny_model's model (seed 0), built once per test run and shared by every test and
    pytest-xdist worker that asks for the same kind and depth (each build costs seconds of
    transformers' import and init; five test files use the same llama). Read-only: a test that
    changes the files (poison_token) builds its own."""
    base = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        base = base.parent  # the workers' common directory for this run
    target = base / f"shared-tiny-{kind}-{layers}"
    with FileLock(f"{target}.lock"):
        if not target.is_dir():  # a complete build only: it is renamed into place
            partial = base / f"{target.name}.partial-{os.getpid()}"
            build_tiny_model(kind, partial, tokenizer_dir, layers=layers)
            partial.rename(target)
    return target


def poison_token(model_dir: Path, token: int) -> Path:
    """Make `token`'s embedding row NaN, so any request whose prompt holds it gets NaN logits
    (a real numeric fault, not a mock). Returns `model_dir`."""
    from safetensors.torch import load_file, save_file

    weights_file = model_dir / "model.safetensors"
    weights = load_file(str(weights_file))
    weights["model.embed_tokens.weight"][token] = float("nan")
    save_file(weights, str(weights_file), metadata={"format": "pt"})
    return model_dir


def mxfp4_checkpoint(model_dir: Path, out_dir: Path) -> Path:
    """`model_dir`'s gpt-oss checkpoint as OpenAI ships gpt-oss: its experts' matrices in
    MXFP4 (`*_blocks` [E, rows, K / 32, 16], byte j holding weights 2j and 2j + 1, and
    `*_scales` [E, rows, K / 32], E8M0 exponents), quantized as llama.cpp quantizes
    (quant_reference.quantize_mxfp4), the config saying so. Returns `out_dir`."""
    import json

    from safetensors.torch import load_file, save_file

    from officellm.kernels.reference import quant_reference

    shutil.copytree(model_dir, out_dir)
    tensors = load_file(str(model_dir / "model.safetensors"))
    out = {}
    for name, tensor in tensors.items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            out[name] = tensor
            continue
        matrix = tensor.transpose(1, 2).contiguous()  # [E, out rows, in]
        e, rows, k = matrix.shape
        gguf = quant_reference.quantize_mxfp4(matrix.reshape(e * rows, k))
        blocks = gguf.view(e, rows, k // 32, 17)
        codes = torch.cat([blocks[..., 1:] & 0x0F, blocks[..., 1:] >> 4], dim=-1)
        out[name + "_blocks"] = (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()
        out[name + "_scales"] = blocks[..., 0].contiguous()
    save_file(out, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"]}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir
