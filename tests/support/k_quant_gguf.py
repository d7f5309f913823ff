"""A small GGUF in llama.cpp's K-quants (Q4_K, Q6_K, with one Q8_0), written here.

The bundled SmolLM2 cannot stand in: its hidden size (576) is no multiple of 256, so
llama.cpp itself stores it without K-quants. This file is the usual download's mix
(Q4_K_M: Q4_K for most matmuls, Q6_K for the value and down projections and the embedding)
on a 2-layer Llama with hidden size 256, random weights, and the bundled model's tokenizer
(so transformers can load it and a chat template applies). The quantizers round each
weight to the nearest level of simple per-block scales: valid blocks in llama.cpp's
layout (kernels/quant_reference.py's header), not llama.cpp's search for the best scales.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kernels import quant_reference as qr

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 256, 512, 2, 4, 2
HEAD_DIM = HIDDEN // HEADS
# Each layer's matmuls and their types: layer 1's fused q/k/v holds three types.
LAYER_TYPES = [
    {"attn_q": qr.Q4_K, "attn_k": qr.Q4_K, "attn_v": qr.Q6_K, "attn_output": qr.Q4_K,
     "ffn_gate": qr.Q4_K, "ffn_up": qr.Q4_K, "ffn_down": qr.Q6_K},
    {"attn_q": qr.Q6_K, "attn_k": qr.Q4_K, "attn_v": qr.Q8_0, "attn_output": qr.Q4_K,
     "ffn_gate": qr.Q4_K, "ffn_up": qr.Q6_K, "ffn_down": qr.Q6_K},
]
EMBEDDING_TYPE = qr.Q6_K  # tied: the output head reads it too


def _round(x: torch.Tensor) -> torch.Tensor:
    return torch.floor(x + 0.5)


def _safe_inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d > 0, 1.0 / d, torch.zeros_like(d))


def quantize_q4_k(w: torch.Tensor) -> torch.Tensor:
    """Float weights [N, K] (K a multiple of 256) -> Q4_K groups uint8 [N, K / 256 * 144]:
    per 32-weight block 16 levels from min(block, 0) to its maximum, the blocks' scales and
    mins as 6-bit multiples of the group's fp16 d and dmin."""
    n = w.shape[0]
    b = w.float().reshape(n, -1, 8, 32)
    lo = b.amin(-1).clamp(max=0.0)
    step = (b.amax(-1) - lo) / 15.0
    d = (step.amax(-1) / 63.0).to(torch.float16)
    dmin = ((-lo).amax(-1) / 63.0).to(torch.float16)
    sc = _round(step * _safe_inverse(d.float()).unsqueeze(-1)).clamp(0, 63).to(torch.uint8)
    mn = _round(-lo * _safe_inverse(dmin.float()).unsqueeze(-1)).clamp(0, 63).to(torch.uint8)
    dl = d.float().unsqueeze(-1) * sc.float()
    ml = dmin.float().unsqueeze(-1) * mn.float()
    q = _round((b + ml.unsqueeze(-1)) * _safe_inverse(dl).unsqueeze(-1)).clamp(0, 15)
    q = q.to(torch.uint8)  # [n, g, 8, 32]
    packed = torch.cat([sc[..., :4] | ((sc[..., 4:] >> 4) << 6),
                        mn[..., :4] | ((mn[..., 4:] >> 4) << 6),
                        (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)], dim=-1)
    nibbles = (q[:, :, 0::2] | (q[:, :, 1::2] << 4)).reshape(n, -1, 128)
    raw = torch.cat([d.unsqueeze(-1).view(torch.uint8), dmin.unsqueeze(-1).view(torch.uint8),
                     packed, nibbles], dim=-1)
    return raw.reshape(n, -1).contiguous()


def quantize_q6_k(w: torch.Tensor) -> torch.Tensor:
    """Float weights [N, K] (K a multiple of 256) -> Q6_K groups uint8 [N, K / 256 * 210]:
    per 16 weights a signed scale max|w| / 31 as an int8 multiple of the group's fp16 d,
    each weight one of 64 levels."""
    n = w.shape[0]
    b = w.float().reshape(n, -1, 16, 16)
    step = b.abs().amax(-1) / 31.0
    d = (step.amax(-1) / 127.0).to(torch.float16)
    sc = _round(step * _safe_inverse(d.float()).unsqueeze(-1)).clamp(-128, 127)
    dl = d.float().unsqueeze(-1) * sc
    q = (_round(b * _safe_inverse(dl).unsqueeze(-1)).clamp(-32, 31) + 32).to(torch.uint8)
    g = q.shape[1]
    q = q.reshape(n, g, 2, 4, 32)  # half, block k of the half, weight l
    # Per half: 32 bytes holding blocks 0 (low nibbles) and 2 (high), then 1 and 3.
    low = q & 15
    ql = torch.stack([low[:, :, :, 0] | (low[:, :, :, 2] << 4),
                      low[:, :, :, 1] | (low[:, :, :, 3] << 4)], dim=3).reshape(n, g, 128)
    high = q >> 4
    qh = (high[:, :, :, 0] | (high[:, :, :, 1] << 2) | (high[:, :, :, 2] << 4)
          | (high[:, :, :, 3] << 6)).reshape(n, g, 64)
    raw = torch.cat([ql, qh, sc.to(torch.int8).view(torch.uint8),
                     d.unsqueeze(-1).view(torch.uint8)], dim=-1)
    return raw.reshape(n, -1).contiguous()


QUANTIZERS = {qr.Q4_K: quantize_q4_k, qr.Q6_K: quantize_q6_k, qr.Q8_0: qr.quantize_q8_0}


def write_k_quant_gguf(path: Path, tokenizer_gguf: Path, seed: int = 0) -> Path:
    """Write the model above to `path`, with `tokenizer_gguf`'s tokenizer fields."""
    import gguf
    from gguf import GGMLQuantizationType as T

    source = gguf.GGUFReader(str(tokenizer_gguf))
    vocab = len(source.fields["tokenizer.ggml.tokens"].data)
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
            writer.add_key_value(name, field.contents(), field.types[0], sub)

    gen = torch.Generator().manual_seed(seed)

    def add_matmul(name: str, rows: int, cols: int, fmt: int, std: float) -> None:
        w = torch.randn(rows, cols, generator=gen) * std
        writer.add_tensor(name, QUANTIZERS[fmt](w).numpy(), raw_dtype=T(fmt))

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
