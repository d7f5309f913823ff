"""Varlen causal attention over the paged cache (prefill and chunked prefill) in Triton.

One launch covers every sequence of the step, whatever its mix of cached prefix and new
tokens: a program owns BLOCK_Q query tokens of one sequence times the query heads of one KV
head (GQA packing: the group's heads become extra rows of the tile, so each K/V tile is read
once per group), and streams that sequence's keys from the paged cache with an online
softmax. This step's keys must already be in the cache (write_kv_cache first).

The grid is sized by the step's total query tokens, as vLLM's is: T // BLOCK_Q + B programs,
sequence b's tiles starting at program qsl[b] // BLOCK_Q + b, and each program finds its
sequence by a binary search over query_start_loc. Sized by B x the longest sequence's tiles,
a mixed step (hundreds of decodes beside one long chunk) launched thousands of programs
that had nothing to do.

A sliding-window layer (window > 0) starts each program at the key tile holding its first
query's first visible key: the blocks before it are never read (they may be the null
block). Sink logits (gpt-oss) join each row's softmax at the end.
"""

from __future__ import annotations

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


@triton.jit
def _prefill_kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, sinks_ptr, out_ptr,
    stride_qt, stride_qh, stride_bt, stride_ot, stride_oh,
    scale_log2, group, kv_heads, head_dim, num_seqs, window,
    PAGE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr, INT8: tl.constexpr,
    WINDOW: tl.constexpr, SINKS: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_Q * BLOCK_G
    pid = tl.program_id(0)
    # The last sequence whose first tile is at or before this program.
    lo = num_seqs * 0  # a 32-bit scalar like hi: a loop-carried variable keeps one type
    hi = num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tl.load(qsl_ptr + mid) // BLOCK_Q + mid <= pid:
            lo = mid
        else:
            hi = mid - 1
    b = lo
    tile = pid - (tl.load(qsl_ptr + b) // BLOCK_Q + b)
    kvh = tl.program_id(1)
    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + b)
    prefix = seq_len - q_len  # cached tokens before this step's queries

    m = tl.arange(0, BLOCK_M)
    tok = tile * BLOCK_Q + m // BLOCK_G
    gi = m % BLOCK_G
    row_ok = (tok < q_len) & (gi < group)
    heads = kvh * group + gi
    q_pos = prefix + tok
    d = tl.arange(0, BLOCK_D)
    dmask = d < head_dim
    qmask = row_ok[:, None] & dmask[None, :]
    q_off = (q_start + tok)[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_off, mask=qmask, other=0.0)

    # Keys up to the tile's last query position; a tile past the sequence's end does nothing
    # (a sequence gets up to one program more than its tiles).
    tile_live = tile * BLOCK_Q < q_len
    kv_end = tl.minimum(seq_len, prefix + (tile + 1) * BLOCK_Q)
    kv_end = tl.where(tile_live, kv_end, 0)
    # Keys from the tile's first query's first visible one: 0, or its window's first.
    kv_first = seq_len * 0
    kv_lo = kv_first
    if WINDOW:
        kv_first = tl.maximum(prefix + tile * BLOCK_Q - window + 1, 0)
        kv_lo = kv_first // BLOCK_N * BLOCK_N

    acc, m_i, l_i = attend_kv_tiles(
        q, q_pos, row_ok, kc_ptr, vc_ptr, bt_ptr + b * stride_bt, kvh, kv_heads, head_dim, d,
        dmask, scale_log2, kv_lo, kv_end, kv_end, kv_first, window,
        ROWS=BLOCK_M, BLOCK_D=BLOCK_D, PAGE=PAGE, BLOCK_N=BLOCK_N, CAUSAL=True, IEEE=IEEE,
        INT8=INT8, WINDOW=WINDOW)
    if SINKS:
        acc, m_i, l_i = fold_sinks(acc, m_i, l_i, sinks_ptr, heads, row_ok)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_off = (q_start + tok)[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=qmask)


def _tile_shape(group: int, max_query_len: int, rows: int = 64) -> tuple[int, int]:
    """(BLOCK_Q, BLOCK_G): about `rows` rows per program, fewer tokens when groups are wide."""
    block_g = next_power_of_2(group)
    block_q = max(1, rows // block_g)
    # Short queries (decodes inside a mixed step) waste less with a smaller tile.
    block_q = min(block_q, next_power_of_2(max(1, max_query_len)))
    while block_q * block_g < 16:  # tl.dot needs at least 16 rows
        block_q *= 2
    return block_q, block_g


def _rows(q_dtype: torch.dtype, head_dim: int) -> int:
    """Query rows per program: 64, or 32 for float32 queries at head size 128 and up (with
    _key_tile's 16 keys: no spill over a float32 cache on sm_90, 1 KB over a 16-bit one,
    where 64 x 32 spilled 35 KB per thread; kernels/triton/compile_check.py) and for every
    query at head size 256 (Gemma 3: 64 rows needed 104 KB of shared memory, over Ada's 99,
    and spilled 0.2-0.8 KB)."""
    return 32 if head_dim >= 256 or (q_dtype == torch.float32 and head_dim >= 128) else 64


def _key_tile(q_dtype: torch.dtype, cache_bytes: int, head_dim: int, window: bool) -> int:
    """Keys per tile: 64, or fewer where a tile of 64 outgrows the GPU at head size 128 and
    up (kernels/triton/compile_check.py measured it): float32 queries need 115 KB of shared
    memory at 64 (Ada has 99 KB) and spill at 32, and a one-byte cache's converted tiles
    spilled registers on sm_80 and sm_89. At head size 256 (with _rows' 32 rows) a 16-bit
    cache's tile of 64 and an int8 one's of 32 spilled on sm_89; 32 and 16 do not. Under a
    sliding window a one-byte cache's tile of 64 spilled on sm_89 at gpt-oss's heads (64
    rows at 255 registers; 32 keys take ~145)."""
    if head_dim < 128:
        return 32 if window and cache_bytes == 1 else 64
    if q_dtype == torch.float32:
        return 16
    if head_dim >= 256:
        return 16 if cache_bytes == 1 else 32
    return 32 if cache_bytes == 1 else 64


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    block_n: int | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as kernels.reference.reference.paged_attention (window 0: none; sinks
    float32 [Hq] or None). max_query_len (the longest sequence's query count) sizes the
    grid; it is read from query_start_loc if not given, which costs a device sync."""
    check_last_dim_contiguous(q)
    t, hq, d = q.shape
    page, hk = k_cache.shape[1], k_cache.shape[2]
    if hq % hk:
        raise ValueError(f"{hq} query heads do not divide into {hk} KV heads")
    check_window_and_sinks(window, sinks, hq)
    group = hq // hk
    out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    bsz = block_tables.shape[0]
    if t == 0 or bsz == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    block_q, block_g = _tile_shape(group, max_query_len, _rows(q.dtype, d))
    int8 = check_cache_rows(k_cache, v_cache, d)
    block_n = block_n or _key_tile(q.dtype, k_cache.element_size(), d, window > 0)
    _prefill_kernel[(t // block_q + bsz, hk)](
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
        seq_lens if sinks is None else sinks, out,
        q.stride(0), q.stride(1), block_tables.stride(0), out.stride(0), out.stride(1),
        scale * LOG2E, group, hk, d, bsz, window,
        PAGE=page, BLOCK_Q=block_q, BLOCK_G=block_g, BLOCK_D=max(16, next_power_of_2(d)),
        BLOCK_N=block_n, IEEE=q.dtype == torch.float32, INT8=int8, WINDOW=window > 0,
        SINKS=sinks is not None, num_warps=4,
    )
    return out
