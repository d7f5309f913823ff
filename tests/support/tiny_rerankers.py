"""Tiny random-weight rerankers: a cross-encoder saved by sentence-transformers, and a
decoder reranker (a Qwen3 causal LM with SmolLM2's tokenizer, which has ChatML's tokens and
"yes" and "no" as tokens of their own)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.support.tiny_models import build_tiny_model


def build_tiny_cross_encoder(out_dir: Path, seed: int = 0) -> Path:
    """A random one-layer BERT with one label (hidden 32) and all-MiniLM-L6-v2's WordPiece
    tokenizer, saved by sentence-transformers as a CrossEncoder in `out_dir`."""
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from officellm.engine import bundled_embedder_dir

    tokenizer = AutoTokenizer.from_pretrained(str(bundled_embedder_dir()))
    torch.manual_seed(seed)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128, num_labels=1))
    hf_dir = out_dir.with_name(out_dir.name + "-hf")
    model.save_pretrained(str(hf_dir))
    tokenizer.save_pretrained(str(hf_dir))
    CrossEncoder(str(hf_dir), device="cpu", max_length=128).save(str(out_dir))
    return out_dir


def build_tiny_decoder_reranker(out_dir: Path, smollm2_dir: Path) -> Path:
    """A random two-layer Qwen3 causal LM (hidden 64) with SmolLM2's tokenizer."""
    return build_tiny_model("qwen3", out_dir, smollm2_dir, layers=2)
