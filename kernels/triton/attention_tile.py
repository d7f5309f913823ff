"""The inner loop both paged-attention kernels share: online softmax over key/value tiles
read from the paged cache through one sequence's block table.

The decode kernel (decode_attention.py) and the varlen prefill kernel
(prefill_attention.py) differ in how they lay out their query rows and which key
range a program covers; everything from loading a tile to folding it into the running
max, sum and accumulator is this one function, and fold_sinks joins the sink logits
(gpt-oss) to the result.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # scores are scaled by scale * LOG2E so the kernels can use exp2


@triton.jit
def _load_rows(cache_ptr, row, d, head_dim, nmask, kv_mask, INT8: tl.constexpr):
    """The tile's cache rows starting at element offsets `row`: values, or int8 times scale
    (float32). The else is needed: after a returning constexpr branch the compiler still
    reads the code below it, and two returns of two types do not compile (the interpreter,
    running plain Python, never noticed)."""
    x = tl.load(cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
    if INT8:
        scale_ptr = (cache_ptr + row + head_dim).to(tl.pointer_type(tl.float32))
        scale = tl.load(scale_ptr, mask=nmask, other=0.0)
        return x.to(tl.float32) * scale[:, None]
    else:
        return x


@triton.jit
def attend_kv_tiles(
    q, q_pos, row_ok, kc_ptr, vc_ptr, bt_row_ptr, kvh, kv_heads, head_dim, d, dmask,
    scale_log2, kv_start, kv_stop, kv_len, kv_first, window,
    ROWS: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, IEEE: tl.constexpr, INT8: tl.constexpr, WINDOW: tl.constexpr,
):
    """Attend q [ROWS, BLOCK_D] (one KV head's query rows) to keys kv_start, kv_start +
    BLOCK_N, ... below kv_stop of one sequence, key n being real when n < kv_len.

    With CAUSAL, row r sees key n only when n <= q_pos[r]; rows with row_ok False (tile
    padding) see every real key, which keeps each row's running max finite from its first
    tile on (no -inf - -inf NaN); their output is discarded. Without CAUSAL every real key
    is visible (a decode's query is its sequence's last token) and q_pos / row_ok are not read.
    With WINDOW (a sliding-window layer) keys below kv_first are neither loaded nor their
    block-table entries read (they may be the null block), and with CAUSAL row r also hides
    the keys n <= q_pos[r] - window (padding rows included); a row may then see no key of a
    tile, so its max is kept finite for the exps. Without WINDOW, kv_first and window are
    not read.
    With INT8 each cache row is head_dim int8 values and then their float32 scale
    (kernels/reference/reference.py: quantize_int8_rows); other caches are rows of head_dim values.
    Returns (acc [ROWS, BLOCK_D], m [ROWS], l [ROWS]) in float32, base-2 log domain: the
    output is acc / l.
    """
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    for start in range(kv_start, kv_stop, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        nmask = n < kv_len
        if WINDOW:
            nmask = nmask & (n >= kv_first)
        page = tl.load(bt_row_ptr + n // PAGE, mask=nmask, other=0).to(tl.int64)
        row = ((page * PAGE + n % PAGE) * kv_heads + kvh) * (head_dim + 4 * INT8)
        kv_mask = nmask[:, None] & dmask[None, :]
        # A one-byte cache (--kv-cache-dtype) is converted to the query's dtype on load.
        k = _load_rows(kc_ptr, row, d, head_dim, nmask, kv_mask, INT8).to(q.dtype)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        if CAUSAL and WINDOW:  # the max is kept finite below: padding rows need see nothing
            visible = (nmask[None, :] & (n[None, :] <= q_pos[:, None])
                       & (n[None, :] > q_pos[:, None] - window))
        elif CAUSAL:
            visible = nmask[None, :] & ((n[None, :] <= q_pos[:, None]) | (~row_ok[:, None]))
        else:
            visible = nmask[None, :]
        s = tl.where(visible, s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if WINDOW:  # a row that has seen no key yet: exp2(-inf - -inf) would be NaN
            m_exp = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_exp = m_new
        alpha = tl.exp2(m_i - m_exp)
        p = tl.exp2(s - m_exp[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = _load_rows(vc_ptr, row, d, head_dim, nmask, kv_mask, INT8).to(q.dtype)
        if IEEE:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def fold_sinks(acc, m_i, l_i, sinks_ptr, heads, row_ok):
    """(acc, m, l) of attend_kv_tiles with each row's sink logit (sinks_ptr[heads], float32,
    natural log domain) joined as one more score with no value: the output acc / l then
    has weights that sum to less than one (gpt-oss). A row that saw no key gets m = sink."""
    sink = tl.load(sinks_ptr + heads, mask=row_ok, other=0.0) * 1.4426950408889634  # LOG2E
    m_new = tl.maximum(m_i, sink)
    alpha = tl.exp2(m_i - m_new)
    return acc * alpha[:, None], m_new, l_i * alpha + tl.exp2(sink - m_new)
