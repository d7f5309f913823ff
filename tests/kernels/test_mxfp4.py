"""MXFP4 blocks in the torch reference (kernels/reference/quant_reference.py) against gguf-py's
NumPy implementation of llama.cpp's format, and gpt-oss's checkpoint layout repacked as
GGUF rows (kernels/reference/mxfp4.py) against transformers' own dequantization of it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from officellm.kernels.reference import quant_reference as qr
from officellm.kernels.reference.mxfp4 import mxfp4_rows_from_checkpoint


@pytest.mark.filterwarnings("ignore:overflow encountered in multiply")  # 12 * 2^127: inf
def test_dequantize_is_gguf_py_bit_for_bit_for_every_exponent_byte():
    """Every byte as the exponent (0 and 1: subnormal scales; 255: 2^127), every nibble."""
    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (256, 17), dtype=torch.uint8, generator=gen)
    blocks[:, 0] = torch.arange(256, dtype=torch.uint8)
    rows = blocks.reshape(32, -1)
    ours = qr.dequantize(rows, qr.MXFP4).numpy()
    theirs = quants.dequantize(rows.numpy(), GGMLQuantizationType.MXFP4).astype(np.float32)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_quantize_mxfp4_writes_gguf_py_s_bytes():
    """Same exponent and the same nearest level (ties to the lower nibble), zero blocks
    and a block of exact levels included."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(16, 256, generator=gen) * torch.logspace(-4, 1, 16).unsqueeze(1)
    w[0, :32] = 0
    w[1, :32] = qr.MXFP4_LEVELS.float().repeat(2) * 2.0 ** -6
    theirs = quants.quantize(w.numpy(), GGMLQuantizationType.MXFP4)
    assert np.array_equal(qr.quantize_mxfp4(w).numpy(), theirs)


def test_quantize_then_dequantize_rounds_to_the_nearest_level():
    w = torch.randn(8, 128, generator=torch.Generator().manual_seed(2))
    back = qr.dequantize(qr.quantize_mxfp4(w), qr.MXFP4)
    step = qr.e8m0_half(qr.quantize_mxfp4(w).reshape(8, 4, 17)[..., 0])  # level 1's value
    step = step.repeat_interleave(32, dim=1)
    # Inside the levels (at most 4 steps apart: 8 -> 12) half a gap is at most 2 steps; the
    # exponent floor(log2(max|w|)) - 2 leaves a block's max up to 16 steps, the top level
    # 12, so the largest weights are clipped by up to 4.
    err = (back - w).abs()
    inside = w.abs() <= 12 * step
    assert torch.all(err[inside] <= 2 * step[inside])
    assert torch.all(err <= 4 * step)


def test_checkpoint_blocks_repack_to_the_values_transformers_dequantizes():
    """gpt-oss's [E, rows, K / 32, 16] blocks and [E, rows, K / 32] scales: GGUF rows
    holding the same values (transformers returns them as [E, K, rows])."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    gen = torch.Generator().manual_seed(3)
    blocks = torch.randint(0, 256, (3, 24, 4, 16), dtype=torch.uint8, generator=gen)
    scales = torch.randint(100, 150, (3, 24, 4), dtype=torch.uint8, generator=gen)
    rows = mxfp4_rows_from_checkpoint(blocks, scales)
    assert rows.shape == (3, 24, 4 * 17)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).transpose(1, 2)
    ours = torch.stack([qr.dequantize(rows[e], qr.MXFP4) for e in range(3)])
    # Nibble 8 is -0 there and +0 here: equal values, as torch.equal compares them.
    assert torch.equal(ours, theirs)


def test_checkpoint_repacking_moves_nibbles_only():
    """Weights 2j, 2j + 1 (a checkpoint byte) land at GGUF's j, j + 16 slots; the exponent
    byte is kept as it is."""
    blocks = torch.zeros(1, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0] = 0x21  # weight 0: nibble 1, weight 1: nibble 2
    blocks[0, 0, 8] = 0x43  # weight 16: nibble 3, weight 17: nibble 4
    row = mxfp4_rows_from_checkpoint(blocks, torch.tensor([[130]], dtype=torch.uint8))[0]
    assert row[0] == 130
    assert row[1] == 0x31 and row[2] == 0x42  # byte j: weight j low, weight j + 16 high


def test_checkpoint_tensors_of_mismatched_shapes_are_refused():
    with pytest.raises(ValueError, match="not"):
        mxfp4_rows_from_checkpoint(torch.zeros(2, 3, 16, dtype=torch.uint8),
                                   torch.zeros(2, 4, dtype=torch.uint8))
