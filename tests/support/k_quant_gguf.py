"""A small GGUF in llama.cpp's K-quants (Q4_K, Q6_K, with one Q8_0), written here.

The bundled SmolLM2 cannot stand in: its hidden size (576) is no multiple of 256, so
llama.cpp itself stores it without K-quants. This file is the usual download's mix
(Q4_K_M: Q4_K for most matmuls, Q6_K for the value and down projections and the embedding)
on a 2-layer Llama with hidden size 256, random weights, and the bundled model's tokenizer
cut to its first VOCAB tokens and the merges among them (so transformers can load it and a
chat template applies; gguf-py decodes a file's tokens and merges one by one, and with the
whole vocabulary transformers' conversion of this file took a minute). The quantizers round each
weight to the nearest level of simple per-block scales (kernels/reference/quant_reference.py's
quantizers): valid blocks in llama.cpp's layout, not llama.cpp's search for the best scales.
"""

from __future__ import annotations

from pathlib import Path

import torch

from officellm.kernels.reference import quant_reference as qr

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 256, 512, 2, 4, 2
VOCAB = 1024  # the special tokens, the 256 bytes and the first merges
HEAD_DIM = HIDDEN // HEADS
# Each layer's matmuls and their types: layer 1's fused q/k/v holds three types.
LAYER_TYPES = [
    {"attn_q": qr.Q4_K, "attn_k": qr.Q4_K, "attn_v": qr.Q6_K, "attn_output": qr.Q4_K,
     "ffn_gate": qr.Q4_K, "ffn_up": qr.Q4_K, "ffn_down": qr.Q6_K},
    {"attn_q": qr.Q6_K, "attn_k": qr.Q4_K, "attn_v": qr.Q8_0, "attn_output": qr.Q4_K,
     "ffn_gate": qr.Q4_K, "ffn_up": qr.Q6_K, "ffn_down": qr.Q6_K},
]
EMBEDDING_TYPE = qr.Q6_K  # tied: the output head reads it too


def write_k_quant_gguf(path: Path, tokenizer_gguf: Path, seed: int = 0) -> Path:
    """Write the model above to `path`, with `tokenizer_gguf`'s tokenizer fields."""
    import gguf
    from gguf import GGMLQuantizationType as T

    source = gguf.GGUFReader(str(tokenizer_gguf))
    tokens = source.fields["tokenizer.ggml.tokens"].contents()[:VOCAB]
    kept = set(tokens)
    cut = {"tokenizer.ggml.tokens": tokens,
           "tokenizer.ggml.token_type": source.fields["tokenizer.ggml.token_type"].contents()[:VOCAB],
           "tokenizer.ggml.merges": [m for m in source.fields["tokenizer.ggml.merges"].contents()
                                     if m.replace(" ", "") in kept
                                     and all(part in kept for part in m.split(" "))]}
    vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("k-quant test model")
    writer.add_context_length(2048)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    for name, field in source.fields.items():
        if name.startswith("tokenizer."):
            sub = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(name, cut.get(name, field.contents()), field.types[0], sub)

    gen = torch.Generator().manual_seed(seed)

    def add_matmul(name: str, rows: int, cols: int, fmt: int, std: float) -> None:
        w = torch.randn(rows, cols, generator=gen) * std
        writer.add_tensor(name, qr.QUANTIZERS[fmt](w).numpy(), raw_dtype=T(fmt))

    def add_norm(name: str) -> None:
        writer.add_tensor(name, (1.0 + 0.1 * torch.randn(HIDDEN, generator=gen)).numpy())

    add_matmul("token_embd.weight", vocab, HIDDEN, EMBEDDING_TYPE, 0.2)
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
              "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, HIDDEN),
              "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}
    for layer, types in enumerate(LAYER_TYPES):
        add_norm(f"blk.{layer}.attn_norm.weight")
        add_norm(f"blk.{layer}.ffn_norm.weight")
        for part, fmt in types.items():
            add_matmul(f"blk.{layer}.{part}.weight", *shapes[part], fmt, 0.08)
    add_norm("output_norm.weight")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
