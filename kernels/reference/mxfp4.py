"""gpt-oss's checkpoint layout of MXFP4 weights, repacked as GGUF's MXFP4 rows (the layout
kernels/reference/quant_reference.py and the C++ matmul read).

The checkpoint keeps each expert matrix as two tensors: `*_blocks` uint8 [..., rows, K / 32,
16], byte j of a block holding weights 2j (low nibble) and 2j + 1 (high), and `*_scales`
uint8 [..., rows, K / 32], the E8M0 exponent s of w = FP4[nibble] 2^(s - 127). GGUF stores
the same block as 17 bytes, the exponent then the nibbles with byte j holding weights j
(low) and j + 16 (high), and reads w = 2 FP4[nibble] 2^(e - 128): the same nibble codes (FP4
doubled, in the same order) and the same exponent byte, so the repacking is lossless and
moves nibbles only.
"""

from __future__ import annotations

import torch

from officellm.kernels.reference.quant_reference import QK


def mxfp4_rows_from_checkpoint(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(blocks uint8 [..., rows, K / 32, 16], scales uint8 [..., rows, K / 32]) in gpt-oss's
    layout -> uint8 [..., rows, K / 32 * 17], GGUF MXFP4 rows of the same values."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != QK // 2:
        raise ValueError(f"blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} are "
                         "not [..., rows, K / 32, 16] and [..., rows, K / 32]")
    blocks, scales = blocks.to(torch.uint8), scales.to(torch.uint8)
    # Weights in order: weight 2j is byte j's low nibble, 2j + 1 its high one.
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2)  # [..., 32]
    nibbles = codes[..., : QK // 2] | (codes[..., QK // 2:] << 4)
    rows = torch.cat([scales.unsqueeze(-1), nibbles], dim=-1)  # [..., rows, K / 32, 17]
    return rows.flatten(-2).contiguous()
