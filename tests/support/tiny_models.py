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


def tiny_config(kind: str, vocab: int, layers: int = 3):
    """A GQA config (8 query heads over 2 KV heads, 3 layers unless told) of the given family."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    c = _common(vocab, layers)
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


def build_tiny_model(kind: str, out_dir: Path, tokenizer_dir: Path, seed: int = 0,
                     layers: int = 3) -> Path:
    """Save a random-weight model of `kind` (`layers` deep) with the tokenizer of
    `tokenizer_dir`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    torch.manual_seed(seed)
    cfg = tiny_config(kind, len(tok), layers)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # Larger weights than the default init give peaked, decisive distributions, so greedy
    # parity is about the engine, not about ties between near-uniform logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2 if "embed" in name or "lm_head" in name else 0.08)
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
