"""Torch reference of the quantized matmul (kernels/cpu_quant_matmul.cpp), and the GGUF
block formats it reads.

A weight stays in GGUF's 32-weight blocks: Q8_0 (fp16 scale d, 32 int8: w = d q), Q4_0 (d,
16 bytes of nibbles: w = d (q - 8)) and Q4_1 (d, fp16 offset m, nibbles: w = d q + m); in
each nibble byte j the low half is weight j and the high half weight j + 16. The matmul
quantizes each row of x per 32-value block to int8 (d = max|x| * (1/127), q = round(x / d)),
so every (weight block, x block) pair is an exact integer dot times two scales, plus, for
Q4_1, m times the x block's float sum. This module performs the kernel's float operations
in the kernel's order (its header states it), so the two are equal bit for bit.
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
    """x float32 [M, K] -> (int8 [M, nb, 32], scales [M, nb], float sums [M, nb]); each
    block's sum in element order."""
    blocks = x.float().reshape(x.shape[0], -1, QK)
    d = blocks.abs().amax(-1) * INV127
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv.unsqueeze(-1)).to(torch.int8)
    total = torch.zeros_like(d)
    for j in range(QK):
        total = total + blocks[..., j]
    return q, d, total


def quant_matmul(x: torch.Tensor, weight: torch.Tensor, fmt: int) -> torch.Tensor:
    """y = x W^T float32 [M, N] for x [M, K] and `weight` uint8 [N, K / 32 * block bytes]."""
    qx, dx, sx = quantize_rows(x)
    qw, dw, mw = unpack(weight, fmt)
    m, nb = dx.shape
    n = qw.shape[0]
    # Lane l of a block's dot covers its elements 4l..4l+3: [nb, 8, M, 4] @ [nb, 8, 4, N].
    # Each lane's dot is an integer below 2^16, exact in float32.
    lx = qx.float().reshape(m, nb, 8, 4).permute(1, 2, 0, 3)
    lw = qw.float().reshape(n, nb, 8, 4).permute(1, 2, 3, 0)
    acc = torch.zeros(8, m, n)
    for b in range(nb):
        dots = torch.matmul(lx[b], lw[b])  # [8, M, N]
        scale = dw[:, b].unsqueeze(0) * dx[:, b].unsqueeze(1)  # [M, N]: d_w * d_x
        acc = acc + dots * scale
    h = acc[0:4] + acc[4:8]
    y = (h[0] + h[2]) + (h[1] + h[3])
    if fmt == Q4_1:
        offset = torch.zeros(m, n)
        for b in range(nb):
            offset = offset + mw[:, b].unsqueeze(0) * sx[:, b].unsqueeze(1)
        y = y + offset
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
