"""Torch reference of the quantized matmul (kernels/cpu/quant_matmul.cpp), and the GGUF
block formats it reads.

Every format is read as 32-weight blocks of small integers with a float scale per segment
(the whole block, or each 16-weight half for Q6_K) and, for the unsigned formats, a float
offset per block:

- Q8_0 (34 B per 32): fp16 d, 32 int8: w = d q.
- Q4_0 (18 B per 32): d, 16 bytes of nibbles: w = d (q - 8).
- Q4_1 (20 B per 32): d, fp16 offset m, nibbles: w = d q + m. In each nibble byte j of
  these two the low half is weight j and the high half weight j + 16.
- Q4_K (144 B per 256, llama.cpp's usual 4-bit): fp16 d and dmin, twelve bytes packing
  eight 6-bit (scale, min) pairs, 128 bytes of nibbles; block j of the 256 is
  w = (d sc_j) q - dmin mn_j, its nibbles the low (j even) or high (j odd) halves of bytes
  32 (j // 2) .. 32 (j // 2) + 31.
- Q6_K (210 B per 256): 128 bytes of low nibbles, 64 bytes of 2-bit high parts, sixteen
  int8 scales (one per 16 weights), fp16 d: w = (d sc_s) (q - 32), q six bits.
- MXFP4 (17 B per 32, gpt-oss's experts): an E8M0 exponent byte e, then nibbles as Q4_0's:
  w = MXFP4_LEVELS[nibble] 2^(e - 128), the levels FP4 (E2M1) values doubled, so integers,
  and the scale a power of two, exact in float32 (e < 2: a subnormal).

d sc is exact in float32 (an 11-bit by at most 8-bit product), so a K-quant block is a
32-block with exact scales, and Q6_K's two 16-weight halves are its two segments.

The matmul quantizes each row of x per 32-value block to int8 (d = max|x| * (1/127),
q = round(x / d)), so every (weight segment, x segment) pair is an exact integer dot times
two scales, plus, for the unsigned formats, m times the x block's float sum. This module
performs the kernel's float operations in the kernel's order (its header states it), so the
two are equal bit for bit.
"""

from __future__ import annotations

import weakref

import torch

QK = 32  # weights per block, the unit of the matmul
# GGUF's type ids (ggml_type) with a kernel; the weights one stored group holds and its bytes.
Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, MXFP4 = 2, 3, 8, 12, 14, 39
GROUP_WEIGHTS = {Q4_0: 32, Q4_1: 32, Q8_0: 32, Q4_K: 256, Q6_K: 256, MXFP4: 32}
GROUP_BYTES = {Q4_0: 18, Q4_1: 20, Q8_0: 34, Q4_K: 144, Q6_K: 210, MXFP4: 17}
NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0", Q4_K: "Q4_K", Q6_K: "Q6_K", MXFP4: "MXFP4"}
# MXFP4's sixteen levels by nibble: E2M1's 0, 0.5, 1, 1.5, 2, 3, 4, 6 (then negated) doubled
# (the scale is halved to match: 2^(e - 128) for OCP's 2^(e - 127)).
MXFP4_LEVELS = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                            dtype=torch.int8)
# Formats whose integers are unsigned with a per-block offset m (the matmul's offset term).
WITH_OFFSET = (Q4_1, Q4_K)
INV127 = torch.tensor(1.0 / 127.0, dtype=torch.float32)


def _halves(raw: torch.Tensor) -> torch.Tensor:
    """[..., 2] uint8 (little-endian fp16) -> float32 [...]."""
    return raw.contiguous().view(torch.float16).squeeze(-1).float()


def e8m0_half(e: torch.Tensor) -> torch.Tensor:
    """E8M0 exponent bytes (any integer dtype) -> float32 2^(e - 128), built from its bits:
    (e - 1) << 23 as a float's exponent, and the subnormals 2^-128, 2^-127 for e = 0, 1."""
    e = e.to(torch.int32)
    bits = torch.where(e < 2, torch.tensor(0x00200000, dtype=torch.int32) << e, (e - 1) << 23)
    return bits.view(torch.float32)


def _k4_scales_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's 12 bytes [..., 12] -> (scales, mins) int32 [..., 8]: bytes 0-3 hold scales 0-3
    in their low six bits, 4-7 the mins 0-3; bytes 8-11 the low four bits of scales 4-7
    (low nibble) and mins 4-7 (high nibble), whose top two bits are bytes 0-3's and 4-7's
    top two bits."""
    p = packed.to(torch.int32)
    lo, mid, hi = p[..., 0:4], p[..., 4:8], p[..., 8:12]
    scales = torch.cat([lo & 63, (hi & 15) | ((lo >> 6) << 4)], dim=-1)
    mins = torch.cat([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], dim=-1)
    return scales, mins


def _unpack_q4_k(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, g = groups.shape[:2]
    d, dmin = _halves(groups[..., 0:2]), _halves(groups[..., 2:4])
    scales, mins = _k4_scales_mins(groups[..., 4:16])
    qs = groups[..., 16:].reshape(n, g, 4, 1, 32)
    q = torch.cat([qs & 0x0F, qs >> 4], dim=3).reshape(n, g * 8, QK).to(torch.int8)
    dl = (d.unsqueeze(-1) * scales.float()).reshape(n, g * 8)
    m = -(dmin.unsqueeze(-1) * mins.float()).reshape(n, g * 8)
    return q, dl.unsqueeze(-1), m


def _unpack_q6_k(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, g = groups.shape[:2]
    ql = groups[..., 0:128].reshape(n, g, 2, 1, 64)
    qh = groups[..., 128:192].reshape(n, g, 2, 1, 32)
    scales = groups[..., 192:208].contiguous().view(torch.int8).float()  # [n, g, 16]
    d = _halves(groups[..., 208:210])
    # Half h of the 256 holds blocks 4h..4h+3: low nibbles of ql[64h : 64h+32], of
    # ql[64h+32 : 64h+64], then their high nibbles; qh[32h + l]'s bit pairs 0-1, 2-3, 4-5,
    # 6-7 are those four blocks' high parts.
    low = torch.cat([ql & 0x0F, ql >> 4], dim=3).reshape(n, g, 2, 4, 32)
    high = torch.cat([(qh >> s) & 3 for s in (0, 2, 4, 6)], dim=3)  # [n, g, 2, 4, 32]
    q = ((low | (high << 4)).to(torch.int16) - 32).to(torch.int8).reshape(n, g * 8, QK)
    dl = (d.unsqueeze(-1) * scales).reshape(n, g * 8, 2)  # a scale per 16 weights
    return q, dl, torch.zeros(n, g * 8)


def unpack(weight: torch.Tensor, fmt: int, ids: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(integers int8 [N, nb, 32], segment scales float32 [N, nb, 1 or 2 (Q6_K)], offsets
    float32 [N, nb]) of a weight held as rows of `fmt` groups or in the C++ kernel's packed
    layout, nb = in_features / 32; of its rows `ids` only when given."""
    if weight.dim() == 3:
        return _unpack_packed(weight, fmt, ids)
    if ids is not None:
        weight = weight[ids]
    n = weight.shape[0]
    groups = weight.view(n, -1, GROUP_BYTES[fmt])
    if fmt == Q4_K:
        return _unpack_q4_k(groups)
    if fmt == Q6_K:
        return _unpack_q6_k(groups)
    if fmt == MXFP4:
        return _nibble_pairs(groups[..., 1:], fmt, e8m0_half(groups[..., 0:1]), None)
    d = _halves(groups[..., 0:2])
    scale = d.unsqueeze(-1)
    if fmt == Q8_0:
        return groups[..., 2:].contiguous().view(torch.int8), scale, torch.zeros_like(d)
    qs = groups[..., 4:] if fmt == Q4_1 else groups[..., 2:]
    return _nibble_pairs(qs, fmt, scale, _halves(groups[..., 2:4]) if fmt == Q4_1 else None)


def _nibble_pairs(qs: torch.Tensor, fmt: int, scale: torch.Tensor, offset: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """unpack's result from [..., 16] nibble bytes, byte j holding weight j (low) and j + 16."""
    q = torch.cat([qs & 0x0F, qs >> 4], dim=-1)
    if fmt == MXFP4:
        q = MXFP4_LEVELS[q.long()]
    else:
        q = q.to(torch.int8)
    if fmt == Q4_0:
        q = q - 8
    return q, scale, offset if offset is not None else torch.zeros_like(scale[..., 0])


# The packed layout (kernels/cpu/quant_matmul_avx2.h) per format: bytes of a unit's header
# (a K-quant's eight rows' float32 d, then Q4_K's -dmin), of a block's scales before its
# quants (fp16, MXFP4's exponent bytes, a K-quant's integer scales), and blocks per unit.
PACKED_HEADER_BYTES = {Q8_0: 0, Q4_0: 0, Q4_1: 0, Q4_K: 64, Q6_K: 32, MXFP4: 0}
PACKED_SCALE_BYTES = {Q8_0: 16, Q4_0: 16, Q4_1: 32, Q4_K: 16, Q6_K: 16, MXFP4: 8}
PACKED_UNIT_BLOCKS = {Q8_0: 1, Q4_0: 1, Q4_1: 1, Q4_K: 8, Q6_K: 8, MXFP4: 1}


def _unpack_packed(weight: torch.Tensor, fmt: int, ids: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """unpack of the packed layout (kernels/cpu/quant_matmul.cpp: quant_pack), uint8 [N / 8,
    units, bytes]: each unit a header (a K-quant's super-block scales) and its blocks, each
    block its eight rows' scales, then its quants as vectors whose 32-bit lane l holds row
    l's next four quant bytes (Q8_0: one weight each; the others: byte j the weights j and
    j + 16, Q6_K's top two bits in two more vectors)."""
    if ids is None:
        ids = torch.arange(weight.shape[0] * 8)
    units = weight[ids // 8]  # [n, units, unit bytes]
    n, nu, _ = units.shape
    rows, lane = torch.arange(n), ids % 8
    per_unit, head = PACKED_UNIT_BLOCKS[fmt], PACKED_HEADER_BYTES[fmt]
    blocks = units[..., head:].reshape(n, nu * per_unit, -1)  # [n, nb, block bytes]
    nb = blocks.shape[1]

    def row_bytes(part: torch.Tensor, width: int) -> torch.Tensor:
        """Lane `lane`'s bytes of each vector of `width`-byte lanes in `part`, in order."""
        lanes = part.reshape(n, part.shape[1], -1, 8, width).permute(0, 3, 1, 2, 4)[rows, lane]
        return lanes.reshape(n, part.shape[1], -1).contiguous()

    sb = PACKED_SCALE_BYTES[fmt]
    quants = row_bytes(blocks[..., sb:sb + (256 if fmt == Q8_0 else 128)], 4)
    if fmt == MXFP4:
        return _nibble_pairs(quants, fmt, e8m0_half(row_bytes(blocks[..., :sb], 1)), None)
    if fmt in (Q4_K, Q6_K):
        # Per block its rows' integer scales (Q4_K: scale then min, unsigned; Q6_K: its two
        # halves', int8), times the unit's float32 d (and Q4_K's -dmin): the kernel's product.
        ints = row_bytes(blocks[..., :sb], 1)  # [n, nb, 2]
        ints = ints.to(torch.int32) if fmt == Q4_K else ints.view(torch.int8).to(torch.int32)
        super_ = row_bytes(units[..., :head], 4).view(torch.float32)  # [n, units, 1 or 2]
        super_ = super_.repeat_interleave(per_unit, dim=1)  # [n, nb, 1 or 2]
        if fmt == Q6_K:
            top = row_bytes(blocks[..., sb + 128:sb + 192], 4)  # [n, nb, 8]: step s at s // 4
            high = torch.stack([(top.reshape(n, nb, 2, 4) >> (2 * k)) & 3
                                for k in range(4)], dim=3).reshape(n, nb, QK)
            q, _, _ = _nibble_pairs(quants, Q4_K, super_, None)
            q = ((q.to(torch.int16) | (high.to(torch.int16) << 4)) - 32).to(torch.int8)
            return q, super_[..., 0:1] * ints.float(), torch.zeros(n, nb)
        return _nibble_pairs(quants, fmt, super_[..., 0:1] * ints[..., 0:1].float(),
                             super_[..., 1] * ints[..., 1].float())
    scales = row_bytes(blocks[..., :sb], 2).view(torch.float16).float()  # [n, nb, 1|2]
    if fmt == Q8_0:
        return quants.view(torch.int8), scales, torch.zeros(n, nb)
    offset = scales[..., 1] if fmt in WITH_OFFSET else None
    return _nibble_pairs(quants, fmt, scales[..., 0:1], offset)


def dequantize(weight: torch.Tensor, fmt: int, ids: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 [N, K] weights the blocks stand for (what llama.cpp's dequantize gives),
    held as rows or packed (see unpack); rows `ids` only when given."""
    q, ds, m = unpack(weight, fmt, ids)
    w = ds.repeat_interleave(QK // ds.shape[-1], dim=-1) * q.float()
    if fmt in WITH_OFFSET:
        w = w + m.unsqueeze(-1)
    return w.reshape(q.shape[0], -1)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x float32 [M, K] -> (int8 [M, nb, 32], scales [M, nb], sums [M, nb]); each block's
    sum is the quantized block's, d times its integer sum (the offset term of Q4_1 and
    Q4_K then reads the same x as the rest of the dot: kernels/cpu/quant_matmul.cpp says
    why)."""
    blocks = x.float().reshape(x.shape[0], -1, QK)
    d = blocks.abs().amax(-1) * INV127
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv.unsqueeze(-1)).to(torch.int8)
    return q, d, d * q.sum(-1, dtype=torch.int32).float()


def _levels(weight: torch.Tensor, fmt: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """unpack's result as the matmul reads it: the integers as float32 [nb * segments, width,
    N], the segment scales [nb * segments, 1, N], the offsets [N, nb]. Kept per weight tensor:
    an engine on this reference calls it for every layer at every step, on weights that do
    not change, and unpacking the packed layout costs more than the matmul."""
    key = (id(weight), fmt)
    cached = _LEVELS.get(key)
    if cached is not None and cached[0]() is weight:
        return cached[1]
    qw, dw, mw = unpack(weight, fmt)
    n, nb, segments = qw.shape[0], dw.shape[1], dw.shape[-1]
    levels = qw.float().reshape(n, nb * segments, QK // segments).permute(1, 2, 0).contiguous()
    scales = dw.reshape(n, nb * segments).t().unsqueeze(1).contiguous()
    # Keyed by identity (a tensor's == is elementwise); the entry goes with its tensor.
    alive = weakref.ref(weight, lambda _: _LEVELS.pop(key, None))
    _LEVELS[key] = alive, (levels, scales, mw)
    return levels, scales, mw


_LEVELS: dict[tuple[int, int], tuple[weakref.ref, tuple]] = {}


def quant_matmul(x: torch.Tensor, weight: torch.Tensor, fmt: int) -> torch.Tensor:
    """y = x W^T [M, N] for x [M, K] and `weight` uint8 [N, K / GROUP_WEIGHTS * GROUP_BYTES]
    (rows of `fmt` groups, or their packed layout): computed in float32, returned in x's
    dtype."""
    dtype, x = x.dtype, x.float()
    qx, dx, sx = quantize_rows(x)
    lw, dw, mw = _levels(weight, fmt)
    m, nb = dx.shape
    segments = lw.shape[0] // nb
    # Each segment's dot is an integer below 2^20 (its partial sums too): exact in float32,
    # so all segments' dots may come from one batched matmul. The scaled dots are then added
    # one segment after another, the kernel's order.
    lx = qx.float().reshape(m, nb * segments, QK // segments).transpose(0, 1)
    dots = torch.bmm(lx, lw)  # [nb * segments, M, N]
    scale = dw * dx.t().repeat_interleave(segments, dim=0).unsqueeze(-1)  # d_w * d_x
    scaled = dots * scale
    y = torch.zeros(m, lw.shape[-1])
    for part in scaled:
        y = y + part
    if fmt in WITH_OFFSET:
        terms = mw.t().unsqueeze(1) * sx.t().unsqueeze(-1)  # [nb, M, N]
        offset = torch.zeros(m, lw.shape[-1])
        for term in terms:
            offset = offset + term
        y = y + offset
    return y.to(dtype)


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


def quantize_mxfp4(w: torch.Tensor) -> torch.Tensor:
    """Float weights [N, K] -> MXFP4 blocks uint8 [N, K / 32 * 17], as llama.cpp rounds:
    e = floor(log2(max|w|)) - 2 + 127 (so the largest level, 12 * 2^(e - 128), is at least
    max|w|; clamped to a byte, 0 for a zero block), then each weight the level nearest to it,
    the lowest nibble on a tie (the one of smaller magnitude, +0 rather than -0)."""
    blocks = w.float().reshape(w.shape[0], -1, QK)
    amax = blocks.abs().amax(-1)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 2 + 127, torch.zeros_like(amax))
    e = e.clamp(0, 255).to(torch.uint8)
    values = e8m0_half(e).unsqueeze(-1).unsqueeze(-1) * MXFP4_LEVELS.float()  # [N, nb, 1, 16]
    q = (values - blocks.unsqueeze(-1)).abs().argmin(-1).to(torch.uint8)  # first on ties
    nibbles = q[..., : QK // 2] | (q[..., QK // 2:] << 4)
    return torch.cat([e.unsqueeze(-1), nibbles], dim=-1).reshape(w.shape[0], -1).contiguous()


# A quantizer per format the K-quant test model and the matmul benchmark write.
QUANTIZERS = {Q4_K: quantize_q4_k, Q6_K: quantize_q6_k, Q8_0: quantize_q8_0,
              MXFP4: quantize_mxfp4}
