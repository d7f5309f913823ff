"""Neox-style rotary embedding of q and k in one Triton launch.

Each product and the final sum are rounded to the activation dtype, as the reference's
`q * cos + rotate_half(q) * sin` is in torch, so bf16 results agree bit for bit up to fused
multiply-adds. With cos/sin narrower than the head (partial rotary, R < D: Phi-4-mini) only
each head's first R values rotate, as pairs (i, i + R/2); the rest are copied.
"""

from __future__ import annotations

import torch

import triton
import triton.language as tl
from officellm.kernels.triton.util import check_last_dim_contiguous, next_power_of_2


@triton.jit
def _rotated_halves(src_ptr, stride_t, stride_h, n_heads, tok, c1, c2, s1, s2, half,
                    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Token tok's heads of src rotated, as two [BLOCK_H, BLOCK_D] halves in src's dtype, with
    the heads and columns they cover (rotary_kv_cache.py stores them into a cache)."""
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < n_heads) & (cols < half)
    base = src_ptr + tok * stride_t + heads * stride_h + cols
    x1 = tl.load(base, mask=mask, other=0.0)
    x2 = tl.load(base + half, mask=mask, other=0.0)
    dt = x1.dtype
    f1 = x1.to(tl.float32)
    f2 = x2.to(tl.float32)
    # out1 = x1*cos1 - x2*sin1; out2 = x2*cos2 + x1*sin2, each term rounded like torch does.
    o1 = (f1 * c1).to(dt).to(tl.float32) + (-(f2 * s1)).to(dt).to(tl.float32)
    o2 = (f2 * c2).to(dt).to(tl.float32) + (f1 * s2).to(dt).to(tl.float32)
    return o1.to(dt), o2.to(dt), heads, cols, mask


@triton.jit
def _cos_sin(cos_ptr, sin_ptr, stride_ct, stride_st, tok, half, dt_ptr,
             BLOCK_D: tl.constexpr):
    """Token tok's cos/sin halves in float32, rounded to dt_ptr's element type first, as the
    reference's `.to(q.dtype)`."""
    cols = tl.arange(0, BLOCK_D)[None, :]
    cmask = cols < half
    dt = dt_ptr.dtype.element_ty
    c1 = tl.load(cos_ptr + tok * stride_ct + cols, mask=cmask, other=0.0).to(dt).to(tl.float32)
    c2 = tl.load(cos_ptr + tok * stride_ct + half + cols, mask=cmask, other=0.0).to(dt).to(tl.float32)
    s1 = tl.load(sin_ptr + tok * stride_st + cols, mask=cmask, other=0.0).to(dt).to(tl.float32)
    s2 = tl.load(sin_ptr + tok * stride_st + half + cols, mask=cmask, other=0.0).to(dt).to(tl.float32)
    return c1, c2, s1, s2


@triton.jit
def _unrotated_rest(src_ptr, stride_t, stride_h, n_heads, tok, half, head_dim,
                    BLOCK_H: tl.constexpr, BLOCK_REST: tl.constexpr):
    """Token tok's heads' values past the rotated width 2 * half (partial rotary), as they
    are: [BLOCK_H, BLOCK_REST], with the heads and columns they cover."""
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = 2 * half + tl.arange(0, BLOCK_REST)[None, :]
    mask = (heads < n_heads) & (cols < head_dim)
    x = tl.load(src_ptr + tok * stride_t + heads * stride_h + cols, mask=mask, other=0.0)
    return x, heads, cols, mask


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, stride_t, stride_h, n_heads, tok, c1, c2, s1, s2,
                  half, head_dim, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_REST: tl.constexpr):
    """Token tok's heads of src rotated into contiguous dst [T, n_heads, head_dim] (BLOCK_REST
    > 0: the values past 2 * half copied as they are)."""
    o1, o2, heads, cols, mask = _rotated_halves(src_ptr, stride_t, stride_h, n_heads, tok,
                                                c1, c2, s1, s2, half, BLOCK_H, BLOCK_D)
    out = dst_ptr + (tok * n_heads + heads) * head_dim + cols
    tl.store(out, o1, mask=mask)
    tl.store(out + half, o2, mask=mask)
    if BLOCK_REST > 0:
        x, heads, cols, mask = _unrotated_rest(src_ptr, stride_t, stride_h, n_heads, tok, half,
                                               head_dim, BLOCK_H, BLOCK_REST)
        tl.store(dst_ptr + (tok * n_heads + heads) * head_dim + cols, x, mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_ct, stride_st,
    n_q_heads, n_k_heads, half, head_dim,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_REST: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)  # 64-bit offsets: tokens * stride may pass 2**31
    c1, c2, s1, s2 = _cos_sin(cos_ptr, sin_ptr, stride_ct, stride_st, tok, half, q_ptr, BLOCK_D)
    _rotate_heads(q_ptr, q_out_ptr, stride_qt, stride_qh, n_q_heads, tok, c1, c2, s1, s2, half,
                  head_dim, BLOCK_HQ, BLOCK_D, BLOCK_REST)
    _rotate_heads(k_ptr, k_out_ptr, stride_kt, stride_kh, n_k_heads, tok, c1, c2, s1, s2, half,
                  head_dim, BLOCK_HK, BLOCK_D, BLOCK_REST)


def rotated_width(head_dim: int, cos: torch.Tensor, sin: torch.Tensor) -> int:
    """The rotated width R of cos/sin [T, R]: even and at most head_dim (the rest of each
    head passes through)."""
    r = cos.shape[-1]
    if sin.shape != cos.shape or r % 2 or not 0 < r <= head_dim:
        raise ValueError(f"cos/sin {tuple(cos.shape)} / {tuple(sin.shape)} do not rotate an "
                         f"even width of at most head_dim {head_dim}")
    return r


def rest_block(head_dim: int, rotated: int) -> int:
    """BLOCK_REST: the values past the rotated width, padded to a power of two (0: none)."""
    return next_power_of_2(head_dim - rotated) if rotated < head_dim else 0


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k [T, Hk, D] (strided views are fine), cos/sin [T, R] (R <= D, even)
    -> new q, k."""
    check_last_dim_contiguous(q, k, cos, sin)
    if q.dtype != k.dtype:
        raise ValueError("q and k must share a dtype")
    t, hq, d = q.shape
    hk = k.shape[1]
    r = rotated_width(d, cos, sin)
    q_out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((t, hk, d), dtype=k.dtype, device=k.device)
    if t:
        _rotary_kernel[(t,)](
            q, k, cos, sin, q_out, k_out,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
            hq, hk, r // 2, d,
            BLOCK_HQ=next_power_of_2(hq), BLOCK_HK=next_power_of_2(hk),
            BLOCK_D=next_power_of_2(r // 2), BLOCK_REST=rest_block(d, r), num_warps=4,
        )
    return q_out, k_out
