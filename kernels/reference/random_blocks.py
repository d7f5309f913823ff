"""Random GGUF block rows for the quantized kernels' tests and benchmarks: any bytes where a
format's integers are, realistic scales where its floats are."""

from __future__ import annotations

import torch

from officellm.kernels.reference import quant_reference as qr

# Where each format keeps its fp16 scales in a group: (first byte, how many).
_FP16_AT = {qr.Q8_0: (0, 1), qr.Q4_0: (0, 1), qr.Q4_1: (0, 2), qr.Q4_K: (0, 2),
            qr.Q6_K: (208, 1)}


def random_blocks(n: int, k: int, fmt: int, gen: torch.Generator) -> torch.Tensor:
    """Rows of `fmt` groups with random integers (and packed sub-scales) and small fp16
    scales (and offsets)."""
    groups = k // qr.GROUP_WEIGHTS[fmt]
    raw = torch.randint(0, 256, (n, groups, qr.GROUP_BYTES[fmt]), dtype=torch.uint8,
                        generator=gen)
    if fmt == qr.MXFP4:  # exponent bytes for 2^-10 .. 2^-4 times the levels (up to 12)
        raw[..., 0] = torch.randint(118, 125, (n, groups), dtype=torch.uint8, generator=gen)
        return raw.reshape(n, -1).contiguous()
    first, count = _FP16_AT[fmt]
    scales = (torch.rand(n, groups, count, generator=gen) * 0.02 + 0.001).to(torch.float16)
    if fmt == qr.Q4_1:
        scales[..., 1] = -scales[..., 1] * 8  # an offset near -8 d, as real blocks have
    raw[..., first:first + 2 * count] = scales.view(torch.uint8)
    if fmt == qr.Q8_0:
        q = raw[..., 2:].view(torch.int8)
        q[q == -128] = -127  # what llama.cpp's quantizer writes
    return raw.reshape(n, -1).contiguous()
