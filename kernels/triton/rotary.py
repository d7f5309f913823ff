"""Neox-style rotary embedding of q and k in one Triton launch.

Each product and the final sum are rounded to the activation dtype, as the reference's
`q * cos + rotate_half(q) * sin` is in torch, so bf16 results agree bit for bit up to fused
multiply-adds.
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
def _rotate_heads(src_ptr, dst_ptr, stride_t, stride_h, n_heads, tok, c1, c2, s1, s2,
                  half, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Token tok's heads of src rotated into contiguous dst [T, n_heads, 2 * half]."""
    o1, o2, heads, cols, mask = _rotated_halves(src_ptr, stride_t, stride_h, n_heads, tok,
                                                c1, c2, s1, s2, half, BLOCK_H, BLOCK_D)
    out = dst_ptr + (tok * n_heads + heads) * (2 * half) + cols
    tl.store(out, o1, mask=mask)
    tl.store(out + half, o2, mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_ct, stride_st,
    n_q_heads, n_k_heads, half,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)  # 64-bit offsets: tokens * stride may pass 2**31
    c1, c2, s1, s2 = _cos_sin(cos_ptr, sin_ptr, stride_ct, stride_st, tok, half, q_ptr, BLOCK_D)
    _rotate_heads(q_ptr, q_out_ptr, stride_qt, stride_qh, n_q_heads, tok, c1, c2, s1, s2, half,
                  BLOCK_HQ, BLOCK_D)
    _rotate_heads(k_ptr, k_out_ptr, stride_kt, stride_kh, n_k_heads, tok, c1, c2, s1, s2, half,
                  BLOCK_HK, BLOCK_D)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k [T, Hk, D] (strided views are fine), cos/sin [T, D] -> new q, k."""
    check_last_dim_contiguous(q, k, cos, sin)
    if q.dtype != k.dtype:
        raise ValueError("q and k must share a dtype")
    t, hq, d = q.shape
    hk = k.shape[1]
    if d % 2:
        raise ValueError(f"rotary needs an even head_dim, got {d}")
    q_out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((t, hk, d), dtype=k.dtype, device=k.device)
    if t:
        _rotary_kernel[(t,)](
            q, k, cos, sin, q_out, k_out,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
            hq, hk, d // 2,
            BLOCK_HQ=next_power_of_2(hq), BLOCK_HK=next_power_of_2(hk),
            BLOCK_D=next_power_of_2(d // 2), num_warps=4,
        )
    return q_out, k_out
