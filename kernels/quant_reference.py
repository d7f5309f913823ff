"""Torch reference of the quantized matmul (kernels/cpu_quant_matmul.cpp), and the GGUF
block formats it reads.

A weight stays in GGUF's 32-weight blocks: Q8_0 (fp16 scale d, 32 int8: w = d q), Q4_0 (d,
16 bytes of nibbles: w = d (q - 8)) and Q4_1 (d, fp16 offset m, nibbles: w = d q + m); in
each nibble byte j the low half is weight j and the high half weight j + 16. The matmul
quantizes each row of x per 32-value block to int8 (d = max|x| * (1/127), q = round(x / d)),
so every (weight block, x block) pair is an exact integer dot times two scales, plus, for
Q4_1, m times the x block's float sum. This module does the same arithmetic; the C++ kernel
differs only in the order of its float sums.
"""

from __future__ import annotations

import torch

QK = 32
# GGUF's type ids (ggml_type) with a kernel, and their block sizes in bytes.
Q4_0, Q4_1, Q8_0 = 2, 3, 8
BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q8_0: 34}
NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0"}
INV127 = torch.tensor(1.0 / 127.0, dtype=torch.float32)


def _halves(raw: torch.Tensor) -> torch.Tensor:
    """[..., 2] uint8 (little-endian fp16) -> float32 [...]."""
    return raw.contiguous().view(torch.float16).squeeze(-1).float()


def unpack(weight: torch.Tensor, fmt: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(integers int8 [N, nb, 32], scales d float32 [N, nb], offsets m float32 [N, nb])."""
    n = weight.shape[0]
    blocks = weight.view(n, -1, BLOCK_BYTES[fmt])
    d = _halves(blocks[..., 0:2])
    if fmt == Q8_0:
        return blocks[..., 2:].contiguous().view(torch.int8), d, torch.zeros_like(d)
    qs = blocks[..., 4:] if fmt == Q4_1 else blocks[..., 2:]
    q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).to(torch.int8)
    if fmt == Q4_0:
        return q - 8, d, torch.zeros_like(d)
    return q, d, _halves(blocks[..., 2:4])


def dequantize(weight: torch.Tensor, fmt: int) -> torch.Tensor:
    """The float32 [N, K] weights the blocks stand for (what llama.cpp's dequantize gives)."""
    q, d, m = unpack(weight, fmt)
    w = d.unsqueeze(-1) * q.float()
    if fmt == Q4_1:
        w = w + m.unsqueeze(-1)
    return w.reshape(weight.shape[0], -1)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x float32 [M, K] -> (int8 [M, nb, 32], scales [M, nb], float sums [M, nb])."""
    blocks = x.float().reshape(x.shape[0], -1, QK)
    d = blocks.abs().amax(-1) * INV127
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv.unsqueeze(-1)).to(torch.int8)
    return q, d, blocks.sum(-1)


def quant_matmul(x: torch.Tensor, weight: torch.Tensor, fmt: int) -> torch.Tensor:
    """y = x W^T float32 [M, N] for x [M, K] and `weight` uint8 [N, K / 32 * block bytes]."""
    qx, dx, sx = quantize_rows(x)
    qw, dw, mw = unpack(weight, fmt)
    # Each block's dot is an integer below 2^24 (32 * 128 * 127): exact in float32 whatever
    # the order of the sum, so a batched float matmul computes the same integers.
    dots = torch.bmm(qx.float().transpose(0, 1), qw.float().permute(1, 2, 0))  # [nb, M, N]
    scale = dx.t().unsqueeze(-1) * dw.t().unsqueeze(1)  # [nb, M, N]
    y = (dots * scale).sum(0)
    if fmt == Q4_1:
        y = y + sx @ mw.t()
    return y


def quantize_q8_0(w: torch.Tensor) -> torch.Tensor:
    """Float weights [N, K] -> Q8_0 blocks uint8 [N, K / 32 * 34] (llama.cpp's rounding)."""
    blocks = w.float().reshape(w.shape[0], -1, QK)
    d = (blocks.abs().amax(-1) / 127.0).to(torch.float16)
    inv = torch.where(d > 0, 1.0 / d.float(), torch.zeros_like(d, dtype=torch.float32))
    q = torch.round(blocks * inv.unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
    raw = torch.cat([d.unsqueeze(-1).view(torch.uint8), q.view(torch.uint8)], dim=-1)
    return raw.reshape(w.shape[0], -1).contiguous()


def quantize_q4_1(w: torch.Tensor) -> torch.Tensor:
    """Float weights [N, K] -> Q4_1 blocks uint8 [N, K / 32 * 20]: per block, 16 levels
    from its minimum to its maximum."""
    blocks = w.float().reshape(w.shape[0], -1, QK)
    lo, hi = blocks.amin(-1), blocks.amax(-1)
    d = ((hi - lo) / 15.0).to(torch.float16)
    m = lo.to(torch.float16)
    inv = torch.where(d > 0, 1.0 / d.float(), torch.zeros_like(d, dtype=torch.float32))
    q = torch.round((blocks - m.float().unsqueeze(-1)) * inv.unsqueeze(-1)).clamp(0, 15)
    q = q.to(torch.uint8)
    nibbles = q[..., : QK // 2] | (q[..., QK // 2:] << 4)
    raw = torch.cat([d.unsqueeze(-1).view(torch.uint8), m.unsqueeze(-1).view(torch.uint8),
                     nibbles], dim=-1)
    return raw.reshape(w.shape[0], -1).contiguous()
