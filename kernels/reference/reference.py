"""Torch reference implementations of every kernel.

The CPU path runs these; the Triton kernels are tested against them. Numerics follow
Hugging Face transformers' Llama/Qwen code exactly (norms in float32, rotary in the model's
dtype), so the engine's fp32 greedy output matches `generate` token for token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, computed in float32 and cast back (as HF does)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual <- x + residual; return (rms_norm(residual), residual)."""
    residual = x + residual
    return rms_norm(residual, weight, eps), residual


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary embedding. q [T, Hq, D], k [T, Hk, D], cos/sin [T, R] (both halves
    of the rotated width R <= D). With R < D (partial rotary: Phi-4-mini) only each head's
    first R values rotate, as pairs (i, i + R/2); the other D - R pass through unchanged."""
    cos = cos.unsqueeze(1).to(q.dtype)
    sin = sin.unsqueeze(1).to(q.dtype)
    r = cos.shape[-1]
    if r == q.shape[-1]:
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    def part(x: torch.Tensor) -> torch.Tensor:
        head, rest = x[..., :r], x[..., r:]
        return torch.cat((head * cos + rotate_half(head) * sin, rest), dim=-1)

    return part(q), part(k)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] holding gate then up -> silu(gate) * up, [T, I]."""
    half = x.shape[-1] // 2
    return F.silu(x[..., :half]) * x[..., half:]


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] holding gate then up -> gelu(gate, tanh approximation) * up, [T, I]
    (Gemma's GeGLU: transformers' gelu_pytorch_tanh)."""
    half = x.shape[-1] // 2
    return F.gelu(x[..., :half], approximate="tanh") * x[..., half:]


def clamped_swiglu(x: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """x [T, 2I] holding gate then up -> (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha
    g) with g = min(gate, limit), [T, I]: gpt-oss's expert activation (its checkpoint
    interleaves gate and up; the loader lays them out as halves)."""
    half = x.shape[-1] // 2
    gate = x[..., :half].clamp(max=limit)
    up = x[..., half:].clamp(-limit, limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store k/v [T, Hk, D] into caches [num_blocks, block_size, Hk, W] at flat slots (W is
    cache_row_width(D, the cache's dtype)).

    A slot of -1 marks a token whose KV is not stored (padding) and is skipped.
    """
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    hk, width = k_cache.shape[-2:]
    for x, cache in ((k, k_cache), (v, v_cache)):
        stored = (quantize_int8_rows(x) if cache.dtype == torch.int8
                  else to_cache_dtype(x, cache.dtype))
        if cache.dtype in FP8_DTYPES:  # torch's index_copy_ has no fp8 kernel: copy the bytes
            cache, stored = cache.view(torch.uint8), stored.view(torch.uint8)
        cache.view(-1, hk, width).index_copy_(0, slot_mapping, stored)


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# An int8 cache row is head_dim int8 values, then their float32 scale as 4 bytes.
INT8_SCALE_BYTES = 4


def cache_row_width(head_dim: int, dtype: torch.dtype) -> int:
    """Elements of one (token, KV head) row of a cache in `dtype`: head_dim, plus an int8
    row's trailing scale."""
    return head_dim + INT8_SCALE_BYTES if dtype == torch.int8 else head_dim


def quantize_int8_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] -> int8 rows [..., D + 4]: round(x * 127 / amax) (halves away from zero
    as floor(. + 0.5) rounds them: one rule every kernel can follow), then amax / 127 as
    float32 bytes. An all-zero row stores zeros and a zero scale."""
    xf = x.float()
    amax = xf.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.floor(xf * inv + 0.5).clamp(-127, 127).to(torch.int8)
    return torch.cat([q, (amax / 127.0).view(torch.int8)], dim=-1)


def read_cache_rows(rows: torch.Tensor, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Cache rows [..., W] as values [..., head_dim] in `dtype` (an int8 row times its scale)."""
    if rows.dtype == torch.int8:
        scale = rows[..., head_dim:].contiguous().view(torch.float32)
        return (rows[..., :head_dim].float() * scale).to(dtype)
    return rows.to(dtype)


def to_cache_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x cast to the cache's dtype; an fp8 cache saturates at its largest finite value (a
    plain cast makes an out-of-range e4m3 value NaN, which would poison every later read)."""
    if dtype in FP8_DTYPES:
        limit = torch.finfo(dtype).max
        return x.float().clamp(-limit, limit).to(dtype)
    return x.to(dtype)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of variable-length queries over the paged cache.

    q [T, Hq, D] holds each sequence's newest tokens back to back (query_start_loc [B+1]);
    sequence b attends to its seq_lens[b] cached tokens, found through block_tables[b], the
    last q_len of which are its own queries. Returns [T, Hq, D]. One sequence at a time: this
    is the specification the fast paths are tested against.

    `window` (a sliding-window layer): the query at position i sees the keys at positions j
    with i - window < j <= i, `window` keys at most (transformers' rule). Blocks wholly
    before every query's window may be the null block: they are never read.
    `sinks` (gpt-oss), float32 [Hq]: a learned logit per query head that joins each row's
    softmax as one more score with no value, so the row's weights sum to less than one.
    """
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    hq, hk = q.shape[1], k_cache.shape[2]
    for b in range(block_tables.shape[0]):
        qs, qe = int(query_start_loc[b]), int(query_start_loc[b + 1])
        if qe == qs:
            continue
        n_ctx = int(seq_lens[b])
        n_blocks = -(-n_ctx // block_size)
        # From the block of the first query's first visible key: the blocks before it may
        # be the null block, whatever it holds (NaN times a zero weight would still be NaN).
        skip = 0 if window is None else max(0, n_ctx - (qe - qs) - window + 1) // block_size
        first = skip * block_size
        blocks = block_tables[b, skip:n_blocks]
        keys = k_cache[blocks].reshape(-1, hk, k_cache.shape[-1])[:n_ctx - first]
        vals = v_cache[blocks].reshape(-1, hk, v_cache.shape[-1])[:n_ctx - first]
        qb = q[qs:qe].float()
        d = q.shape[-1]
        keys = read_cache_rows(keys, d, torch.float32).repeat_interleave(hq // hk, dim=1)
        vals = read_cache_rows(vals, d, torch.float32).repeat_interleave(hq // hk, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qb, keys) * scale
        q_pos = torch.arange(n_ctx - (qe - qs), n_ctx).unsqueeze(1)
        k_pos = torch.arange(first, n_ctx).unsqueeze(0)
        hidden = k_pos > q_pos
        if window is not None:
            hidden = hidden | (k_pos <= q_pos - window)
        scores = scores.masked_fill(hidden.unsqueeze(0), float("-inf"))
        out[qs:qe] = torch.einsum("hqk,khd->qhd", softmax_with_sinks(scores, sinks),
                                  vals).to(q.dtype)
    return out


def softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dimension of float32 scores [H, Q, K]; with sinks [H], each
    head's sink logit joins every row's denominator (and takes no value)."""
    if sinks is None:
        return scores.softmax(-1)
    sink = sinks.float().view(-1, 1, 1).expand(-1, scores.shape[1], 1)
    return torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
