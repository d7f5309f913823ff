"""Store this step's keys and values into the paged cache by slot mapping."""

from __future__ import annotations

import torch

import triton
import triton.language as tl
from officellm.kernels.reference.reference import FP8_DTYPES
from officellm.kernels.triton.util import (
    check_cache_rows,
    check_last_dim_contiguous,
    next_power_of_2,
)


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    n_heads, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, LIMIT: tl.constexpr, INT8: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)  # 64-bit offsets: tokens * stride may pass 2**31
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, BLOCK_D)[None, :]
    # Slot -1 marks padding (CUDA-graph filler rows): nothing is stored for it.
    mask = (heads < n_heads) & (cols < head_dim) & (slot >= 0)
    k = tl.load(k_ptr + tok * stride_kt + heads * stride_kh + cols, mask=mask, other=0.0)
    v = tl.load(v_ptr + tok * stride_vt + heads * stride_vh + cols, mask=mask, other=0.0)
    # The cache is contiguous [blocks, block_size, heads, width]: a slot is heads rows of
    # width elements (head_dim, plus an int8 row's float32 scale).
    width = head_dim + 4 * INT8
    row = slot * (n_heads * width) + heads * width
    if INT8:
        row_mask = (heads < n_heads) & (slot >= 0)
        _store_int8_rows(kc_ptr, row, cols, head_dim, k, mask, row_mask)
        _store_int8_rows(vc_ptr, row, cols, head_dim, v, mask, row_mask)
    else:
        _store_rows(kc_ptr + row + cols, k, mask, LIMIT)
        _store_rows(vc_ptr + row + cols, v, mask, LIMIT)


@triton.jit
def _store_rows(ptr, x, mask, LIMIT: tl.constexpr):
    """x at ptr in the cache's dtype; with LIMIT > 0 (an fp8 cache) saturated at its largest
    finite value instead of becoming NaN."""
    if LIMIT > 0:
        x = tl.minimum(tl.maximum(x.to(tl.float32), -LIMIT), LIMIT)
    tl.store(ptr, x.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_int8_rows(cache_ptr, row, cols, head_dim, x, mask, row_mask):
    """x [H, D] as int8 rows with their scale, as kernels.reference.reference.quantize_int8_rows."""
    xf = x.to(tl.float32)
    amax = tl.max(tl.abs(xf), axis=1)[:, None]
    _store_int8_values(cache_ptr + row + cols, xf, amax, mask)
    _store_int8_scale(cache_ptr + row + head_dim, amax, row_mask)


@triton.jit
def _store_int8_values(ptr, xf, amax, mask):
    """float32 values xf of rows whose largest magnitude is amax [H, 1], as int8 at ptr."""
    inv = tl.where(amax > 0, 127.0 / tl.where(amax > 0, amax, 1.0), 0.0)
    q = tl.minimum(tl.maximum(tl.floor(xf * inv + 0.5), -127.0), 127.0)
    tl.store(ptr, q.to(tl.int8), mask=mask)


@triton.jit
def _store_int8_scale(ptr, amax, row_mask):
    """The rows' scale amax / 127 as float32 at ptr (an int8 pointer past the row's values)."""
    tl.store(ptr.to(tl.pointer_type(tl.float32)), amax / 127.0, mask=row_mask)


def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """k/v [T, Hk, D] -> caches [num_blocks, block_size, Hk, W] at flat slots; -1 skipped.
    The caches are in k's dtype, fp8 (stored saturated) or int8 (rows with their scale), as
    kernels.reference.reference stores them."""
    check_last_dim_contiguous(k, v)
    t, hk, d = k.shape
    int8 = check_cache_rows(k_cache, v_cache, d)
    if t:
        _write_kv_kernel[(t,)](
            k, v, k_cache, v_cache, slot_mapping,
            k.stride(0), k.stride(1), v.stride(0), v.stride(1), hk, d,
            BLOCK_H=next_power_of_2(hk), BLOCK_D=next_power_of_2(d),
            LIMIT=torch.finfo(k_cache.dtype).max if k_cache.dtype in FP8_DTYPES else 0.0,
            INT8=int8, num_warps=4,
        )
