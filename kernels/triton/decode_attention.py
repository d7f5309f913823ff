"""Paged decode attention (one new token per sequence) in Triton.

GQA-aware: one program owns the query heads of one KV head, so each K/V tile is read from
memory once per group rather than once per query head. Long contexts are split along the
sequence into NUM_SPLITS programs (flash-decoding) whose partial results a second, tiny
kernel merges; the split count depends only on the batch shape, never on the lengths, so a
captured CUDA graph stays valid for any context length.

A sliding-window layer (window > 0) splits only the tiles that hold the query's last
`window` keys: the tiles before them are skipped and their blocks never read (they may be
the null block), so one sliding sequence costs a window's work however long it is. The
window is a scalar argument (a layer's constant, baked into a captured graph), the lengths
stay device data. Sink logits (gpt-oss) are folded into split 0's partial result, so the
merge counts them once per row.
"""

from __future__ import annotations

import functools

import torch

import triton
import triton.language as tl
from officellm.kernels.triton.attention_tile import LOG2E, attend_kv_tiles, fold_sinks
from officellm.kernels.triton.util import (
    check_cache_rows,
    check_last_dim_contiguous,
    check_window_and_sinks,
    next_power_of_2,
)

MAX_SPLITS = 16


@triton.jit
def _decode_kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_lens_ptr, sinks_ptr,
    out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr,
    stride_qb, stride_qh, stride_bt, stride_ob, stride_oh,
    scale_log2, group, kv_heads, head_dim, window,
    PAGE: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr, INT8: tl.constexpr,
    WINDOW: tl.constexpr, SINKS: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    n_tiles = tl.cdiv(seq_len, BLOCK_N)
    kv_first = seq_len * 0  # the first visible key: 0, or the window's first
    first_tile = kv_first
    if WINDOW:
        kv_first = tl.maximum(seq_len - window, 0)
        first_tile = kv_first // BLOCK_N
    per_split = tl.cdiv(n_tiles - first_tile, NUM_SPLITS)
    tile_lo = first_tile + split * per_split
    tile_hi = tl.minimum(tile_lo + per_split, n_tiles)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kvh * group + g
    gmask = g < group
    dmask = d < head_dim
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)

    # The query is the sequence's last token: every real key from kv_first on is visible, so
    # no causal mask. Every tile in [tile_lo, tile_hi) holds at least one visible key, so the
    # max stays finite.
    q_pos = tl.zeros([BLOCK_G], tl.int32) + (seq_len - 1)
    acc, m_i, l_i = attend_kv_tiles(
        q, q_pos, gmask, kc_ptr, vc_ptr, bt_ptr + b * stride_bt, kvh, kv_heads, head_dim, d,
        dmask, scale_log2, tile_lo * BLOCK_N, tile_hi * BLOCK_N, seq_len, kv_first, window,
        ROWS=BLOCK_G, BLOCK_D=BLOCK_D, PAGE=PAGE, BLOCK_N=BLOCK_N, CAUSAL=False, IEEE=IEEE,
        INT8=INT8, WINDOW=WINDOW)
    if SINKS:
        if split == 0:
            acc, m_i, l_i = fold_sinks(acc, m_i, l_i, sinks_ptr, heads, gmask)

    omask = gmask[:, None] & dmask[None, :]
    if NUM_SPLITS == 1:
        # An empty sequence (a CUDA-graph padding row) yields zeros, never NaN.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        n_q_heads = group * kv_heads
        part = (b * n_q_heads + heads) * NUM_SPLITS + split
        tl.store(part_acc_ptr + part[:, None] * head_dim + d[None, :], acc, mask=omask)
        tl.store(part_m_ptr + part, m_i, mask=gmask)
        tl.store(part_l_ptr + part, l_i, mask=gmask)


@triton.jit
def _merge_kernel(
    part_acc_ptr, part_m_ptr, part_l_ptr, out_ptr,
    stride_ob, stride_oh, n_q_heads, head_dim,
    NUM_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, BLOCK_D)
    dmask = d < head_dim
    base = (b * n_q_heads + h) * NUM_SPLITS
    m = tl.load(part_m_ptr + base + s)
    l_s = tl.load(part_l_ptr + base + s)
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    # Splits that saw no key carry m = -inf and weigh exactly zero.
    w = tl.where(m == float("-inf"), 0.0, tl.exp2(m - m_max))
    denom = tl.sum(l_s * w, axis=0)
    acc = tl.load(part_acc_ptr + (base + s)[:, None] * head_dim + d[None, :],
                  mask=dmask[None, :], other=0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(denom > 0, denom, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty),
             mask=dmask)


@functools.lru_cache(maxsize=8)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8  # the interpreter: a few splits, so the merge path is exercised on the CPU too


def default_num_splits(batch: int, kv_heads: int, device: torch.device) -> int:
    """Enough (batch x KV head x split) programs to fill the GPU about twice; a power of 2."""
    want = triton.cdiv(2 * _sm_count(device), max(1, batch * kv_heads))
    return min(MAX_SPLITS, next_power_of_2(want))


def _key_tile(q_dtype: torch.dtype, cache_bytes: int, head_dim: int) -> int:
    """Keys per tile: 64, or 16 for float32 queries at head size 128 and up, where a tile of
    64 spilled 15 KB of registers per thread on sm_90 (16: none over a float32 cache, 0.5 KB
    over a 16-bit one; kernels/triton/compile_check.py), and for a one-byte cache at head
    size 256 (Gemma 3), whose converted tiles of 64 spilled 1.1-1.5 KB and of 32 a few bytes
    over int8 on sm_80."""
    if q_dtype == torch.float32 and head_dim >= 128:
        return 16
    return 16 if head_dim >= 256 and cache_bytes == 1 else 64


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    block_n: int | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, Hq, D], one query per sequence, attending to its seq_lens[b] cached tokens
    (its own included) through block_tables[b]. Same result as the reference with
    query_start_loc = arange(B+1), `window` (0: none; else the last `window` keys are
    visible, the blocks before them never read) and `sinks` (float32 [Hq] or None). A
    sequence of length 0 yields zeros."""
    check_last_dim_contiguous(q)
    bsz, hq, d = q.shape
    page, hk = k_cache.shape[1], k_cache.shape[2]
    if hq % hk:
        raise ValueError(f"{hq} query heads do not divide into {hk} KV heads")
    check_window_and_sinks(window, sinks, hq)
    group = hq // hk
    out = torch.empty((bsz, hq, d), dtype=q.dtype, device=q.device)
    if bsz == 0:
        return out
    splits = num_splits or default_num_splits(bsz, hk, q.device)
    if splits & (splits - 1):
        raise ValueError("num_splits must be a power of two")
    block_d = max(16, next_power_of_2(d))
    if splits > 1:
        part_acc = torch.empty((bsz, hq, splits, d), dtype=torch.float32, device=q.device)
        part_m = torch.empty((bsz, hq, splits), dtype=torch.float32, device=q.device)
        part_l = torch.empty((bsz, hq, splits), dtype=torch.float32, device=q.device)
    else:
        part_acc = part_m = part_l = out  # unused by the single-split variant
    _decode_kernel[(bsz, hk, splits)](
        q, k_cache, v_cache, block_tables, seq_lens, seq_lens if sinks is None else sinks,
        out, part_acc, part_m, part_l,
        q.stride(0), q.stride(1), block_tables.stride(0), out.stride(0), out.stride(1),
        scale * LOG2E, group, hk, d, window,
        PAGE=page, NUM_SPLITS=splits, BLOCK_G=max(16, next_power_of_2(group)),
        BLOCK_D=block_d, BLOCK_N=block_n or _key_tile(q.dtype, k_cache.element_size(), d),
        IEEE=q.dtype == torch.float32,
        INT8=check_cache_rows(k_cache, v_cache, d), WINDOW=window > 0, SINKS=sinks is not None,
        num_warps=4,
    )
    if splits > 1:
        _merge_kernel[(bsz, hq)](
            part_acc, part_m, part_l, out, out.stride(0), out.stride(1), hq, d,
            NUM_SPLITS=splits, BLOCK_D=block_d, num_warps=1,
        )
    return out
