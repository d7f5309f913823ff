"""Store this step's keys and values into the paged cache by slot mapping."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._triton_util import check_last_dim_contiguous, next_power_of_2
from kernels.reference import FP8_DTYPES


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    n_heads, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, LIMIT: tl.constexpr,
):
    tok = tl.program_id(0)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, BLOCK_D)[None, :]
    # Slot -1 marks padding (CUDA-graph filler rows): nothing is stored for it.
    mask = (heads < n_heads) & (cols < head_dim) & (slot >= 0)
    k = tl.load(k_ptr + tok * stride_kt + heads * stride_kh + cols, mask=mask)
    v = tl.load(v_ptr + tok * stride_vt + heads * stride_vh + cols, mask=mask)
    if LIMIT > 0:  # an fp8 cache saturates at its largest finite value instead of NaN
        k = tl.minimum(tl.maximum(k.to(tl.float32), -LIMIT), LIMIT)
        v = tl.minimum(tl.maximum(v.to(tl.float32), -LIMIT), LIMIT)
    # The cache is contiguous [blocks, block_size, heads, dim]: a slot is a row of heads*dim.
    dst = slot * (n_heads * head_dim) + heads * head_dim + cols
    tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=mask)
    tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """k/v [T, Hk, D] -> caches [num_blocks, block_size, Hk, D] at flat slots; -1 skipped.
    The caches are in k's dtype, or fp8 (stored saturated, as kernels.reference does)."""
    check_last_dim_contiguous(k, v)
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("KV caches must be contiguous")
    t, hk, d = k.shape
    if t:
        _write_kv_kernel[(t,)](
            k, v, k_cache, v_cache, slot_mapping,
            k.stride(0), k.stride(1), v.stride(0), v.stride(1), hk, d,
            BLOCK_H=next_power_of_2(hk), BLOCK_D=next_power_of_2(d),
            LIMIT=torch.finfo(k_cache.dtype).max if k_cache.dtype in FP8_DTYPES else 0.0,
            num_warps=4,
        )
