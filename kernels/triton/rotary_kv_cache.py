"""The rotary embedding fused with the KV-cache write: one launch per layer where there were
two, and the rotated keys go straight from registers into the cache.

One program per token rotates its query heads into a new q (neox style, as rotary.py) and its
key heads into the cache at the token's slot, and copies its values into the value cache (as
kv_cache.py). The rotated values are rounded to the activation dtype exactly as apply_rotary
rounds them before the cache's conversion, so q and both caches hold, byte for byte, what
apply_rotary followed by write_kv_cache stores.
"""

from __future__ import annotations

import torch

import triton
import triton.language as tl
from officellm.kernels.reference.reference import FP8_DTYPES
from officellm.kernels.triton.kv_cache import (
    _store_int8_rows,
    _store_int8_scale,
    _store_int8_values,
    _store_rows,
)
from officellm.kernels.triton.rotary import (
    _cos_sin,
    _rotate_heads,
    _rotated_halves,
    _unrotated_rest,
    rest_block,
    rotated_width,
)
from officellm.kernels.triton.util import (
    check_cache_rows,
    check_last_dim_contiguous,
    next_power_of_2,
)


@triton.jit
def _rotary_write_kv_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, q_out_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ct, stride_st,
    n_q_heads, n_k_heads, half, head_dim,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_REST: tl.constexpr, LIMIT: tl.constexpr, INT8: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)  # 64-bit offsets: tokens * stride may pass 2**31
    c1, c2, s1, s2 = _cos_sin(cos_ptr, sin_ptr, stride_ct, stride_st, tok, half, q_ptr,
                              BLOCK_HALF)
    _rotate_heads(q_ptr, q_out_ptr, stride_qt, stride_qh, n_q_heads, tok, c1, c2, s1, s2, half,
                  head_dim, BLOCK_HQ, BLOCK_HALF, BLOCK_REST)
    k1, k2, heads, cols, kmask = _rotated_halves(k_ptr, stride_kt, stride_kh, n_k_heads, tok,
                                                 c1, c2, s1, s2, half, BLOCK_HK, BLOCK_HALF)
    # Slot -1 marks padding (CUDA-graph filler rows): nothing is stored for it.
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    # The cache is contiguous [blocks, block_size, heads, width]: a slot is heads rows of
    # width elements (head_dim, plus an int8 row's float32 scale).
    width = head_dim + 4 * INT8
    row = slot * (n_k_heads * width) + heads * width
    row_mask = (heads < n_k_heads) & (slot >= 0)
    kmask = kmask & (slot >= 0)
    vcols = tl.arange(0, BLOCK_D)[None, :]
    vmask = (heads < n_k_heads) & (vcols < head_dim) & (slot >= 0)
    v = tl.load(v_ptr + tok * stride_vt + heads * stride_vh + vcols, mask=vmask, other=0.0)
    if BLOCK_REST > 0:  # partial rotary: the key's unrotated values, as they are
        k3, _, rcols, rmask = _unrotated_rest(k_ptr, stride_kt, stride_kh, n_k_heads, tok, half,
                                              head_dim, BLOCK_HK, BLOCK_REST)
        rmask = rmask & (slot >= 0)
    if INT8:
        # A key row's scale is over the whole row: both rotated halves and any rest.
        f1 = k1.to(tl.float32)
        f2 = k2.to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(f1), axis=1), tl.max(tl.abs(f2), axis=1))
        if BLOCK_REST > 0:
            f3 = k3.to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(f3), axis=1))
            _store_int8_values(kc_ptr + row + rcols, f3, amax[:, None], rmask)
        _store_int8_values(kc_ptr + row + cols, f1, amax[:, None], kmask)
        _store_int8_values(kc_ptr + row + half + cols, f2, amax[:, None], kmask)
        _store_int8_scale(kc_ptr + row + head_dim, amax[:, None], row_mask)
        _store_int8_rows(vc_ptr, row, vcols, head_dim, v, vmask, row_mask)
    else:
        if BLOCK_REST > 0:
            _store_rows(kc_ptr + row + rcols, k3, rmask, LIMIT)
        _store_rows(kc_ptr + row + cols, k1, kmask, LIMIT)
        _store_rows(kc_ptr + row + half + cols, k2, kmask, LIMIT)
        _store_rows(vc_ptr + row + vcols, v, vmask, LIMIT)


def rotary_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hk, D] (strided views are fine), cos/sin [T, R] (R <= D, even:
    partial rotary leaves each head's last D - R values as they are): rotate k into
    k_cache and copy v into v_cache at the flat slots (-1 skipped), and return the rotated q
    as a new [T, Hq, D] tensor. The caches and q are those of apply_rotary then
    write_kv_cache, bit for bit."""
    check_last_dim_contiguous(q, k, v, cos, sin)
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError("q, k and v must share a dtype")
    t, hq, d = q.shape
    hk = k.shape[1]
    r = rotated_width(d, cos, sin)
    int8 = check_cache_rows(k_cache, v_cache, d)
    q_out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    if t:
        _rotary_write_kv_kernel[(t,)](
            q, k, v, cos, sin, q_out, k_cache, v_cache, slot_mapping,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            cos.stride(0), sin.stride(0), hq, hk, r // 2, d,
            BLOCK_HQ=next_power_of_2(hq), BLOCK_HK=next_power_of_2(hk),
            BLOCK_HALF=next_power_of_2(r // 2), BLOCK_D=next_power_of_2(d),
            BLOCK_REST=rest_block(d, r),
            LIMIT=torch.finfo(k_cache.dtype).max if k_cache.dtype in FP8_DTYPES else 0.0,
            INT8=int8, num_warps=4,
        )
    return q_out
