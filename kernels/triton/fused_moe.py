"""A mixture-of-experts layer's experts in Triton: kernels/reference/moe.py's moe_experts on
a GPU, over dense expert weights or MXFP4 blocks as GGUF ships gpt-oss.

Each token goes to k experts, so a batch of T tokens is T*k (token, slot) pairs, and each
expert sees a different subset of them. The layer runs in four launches, none of which
waits on the host for a data-dependent size (a decode step is captured in a CUDA graph):

1. Sort (two small kernels): the pairs are grouped by expert into one buffer, each expert's
   run padded to a whole number of BLOCK_M-row blocks, and each block labelled with its
   expert. The buffer is sized by an upper bound (every pair, plus BLOCK_M - 1 padding rows
   for each expert that can have pairs), so its length depends on T, k and E alone; blocks
   past the used part carry the label E and do nothing.
2. Gate-up GEMM: each program multiplies one block's rows of x by BLOCK_N gate rows and
   the matching BLOCK_N up rows of its expert's w13, so the gated activation (with the
   biases) is applied in the epilogue and only [rows, I] is written.
3. Down GEMM: the activated rows times the expert's w2, plus bias, times the pair's routing
   weight, written to row (token, slot) of a [T*k, H] buffer.
4. The sum over each token's k slots (torch, accumulating in float32): deterministic.

Where a pair lands inside its expert's run decides only which tile row computes it, not its
arithmetic; the sort keeps the pairs' order anyway (stable), so runs are reproducible.

Numerics follow the reference's rounding points: each GEMM accumulates in float32, its
result is rounded to the activation dtype, the bias added and rounded again, the activation
rounds where torch's would (silu/gelu before the multiply), the routing weight is rounded to
the activation dtype. The reference then adds the k results in the activation dtype in
expert order; here they are added in float32 and rounded once.

MXFP4 (GGUF type 39): each row of K weights is K/32 blocks of 17 bytes, an E8M0 exponent
byte e then 16 bytes whose low nibble is weight j and high nibble weight j + 16; the weight
is kvalues[nibble] * 2**(e - 128), kvalues the e2m1 values doubled. sm_80/89/90 have no FP4
units, so a tile is dequantized to the activation dtype (exactly in bf16 and fp32: at most
two significant bits times a power of two; in fp16 while it is within fp16's range, as
checkpoint scales are) and goes to tl.dot. A tile is read as its low-nibble and its
high-nibble halves, and the activations are loaded in that same K order (weights 0-15, then
16-31 of each block, as two dots): a dot product does not depend on the order of K, and no
nibble needs moving between registers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import triton
import triton.language as tl
from officellm.kernels.reference.moe import ExpertActivation, ExpertWeights
from officellm.kernels.triton.util import check_last_dim_contiguous, next_power_of_2

MXFP4 = 39  # gguf.GGMLQuantizationType.MXFP4
MXFP4_BLOCK_WEIGHTS, MXFP4_BLOCK_BYTES = 32, 17
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1, "clamped_swiglu": 2}
DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# The sort: pairs per program (each compares its pairs with each other, [CHUNK, CHUNK]),
# rows of the per-chunk count table read per step, blocks labelled per step.
SORT_CHUNK = 128
SORT_COUNT_ROWS = 32
SORT_LABEL_BLOCKS = 64


@dataclass(frozen=True)
class MoETiles:
    """One launch's tile sizes: BLOCK_M rows of pairs (also the padding unit of each
    expert's run), BLOCK_N output columns (per half in the gate-up GEMM), BLOCK_K of the
    reduction per step; warps and software-pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# Chosen by reasoning and by what ptxas reports (compile_check: no variant spills), not yet
# by measurement (benchmarks/gpucheck times the decode step on a GPU):
# - Decode (at most 16 pairs per expert on average: a decode step up to batch 256 at 128
#   experts top-8): an expert's block holds a few real rows, so BLOCK_M is the smallest the
#   tensor cores take (16), and the layer is a stream of expert weights, which wants many
#   programs reading at once: BLOCK_N 32 gives Qwen3-30B-A3B's gate-up 24 column blocks per
#   expert (192 programs at top-8), its down GEMM 64; BLOCK_K 128 keeps each load long, and
#   three stages put 40 KiB in flight per program (64 registers).
# - Prefill: blocks are mostly full and a weight tile serves BLOCK_M rows: the usual 64x64
#   tensor-core tile, 64 deep (48-72 KiB of shared memory over three stages; sm_89 has 99).
# - MXFP4: one 32-weight block per K step. Its 17-byte blocks are not aligned for vector
#   loads, so Triton neither copies them asynchronously nor pipelines them: each step's bytes
#   are loaded into registers and dequantized there (a deeper step took 200-255 registers
#   and spilled on sm_80/89). Decode takes 64 columns per program so that a program still
#   has 2 KiB of weight bytes in flight per step, at 128 registers (four programs per SM).
# - float32 (a correctness reference, not a serving dtype) runs as FMAs, not tensor
#   cores: half the K depth for the same shared memory.
DECODE_PAIRS_PER_EXPERT = 16
_DECODE = {"dense16": MoETiles(16, 32, 128, 4, 3), "mxfp4": MoETiles(16, 64, 32, 4, 3),
           "dense32": MoETiles(16, 32, 64, 4, 3)}
_PREFILL = {"dense16": MoETiles(64, 64, 64, 4, 3), "mxfp4": MoETiles(64, 64, 32, 4, 3),
            "dense32": MoETiles(64, 64, 32, 4, 3)}


def moe_tiles(num_pairs: int, num_experts: int, dtype: torch.dtype, mxfp4: bool) -> MoETiles:
    """The tiles for T*k = num_pairs pairs over num_experts experts (see _DECODE/_PREFILL):
    decode tiles while the average expert gets at most DECODE_PAIRS_PER_EXPERT pairs.
    Both GEMMs of a call use one set (the sort pads runs to its BLOCK_M)."""
    kind = "mxfp4" if mxfp4 else "dense32" if dtype == torch.float32 else "dense16"
    decode = num_pairs <= DECODE_PAIRS_PER_EXPERT * num_experts
    return (_DECODE if decode else _PREFILL)[kind]


# ---------------------------------------------------------------------------------------
# 1. Sorting the pairs by expert.


@triton.jit(do_not_specialize=["num_pairs"])
def _moe_count_kernel(ids_ptr, rank_ptr, counts_ptr, num_pairs, num_experts,
                      E_PAD: tl.constexpr, CHUNK: tl.constexpr):
    """Per chunk of pairs: how many go to each expert, and each pair's rank among the
    earlier pairs of its chunk that go to the same expert."""
    chunk = tl.program_id(0)
    idx = tl.arange(0, CHUNK)
    offs = chunk * CHUNK + idx
    in_range = offs < num_pairs
    expert = tl.load(ids_ptr + offs, mask=in_range, other=-1).to(tl.int32)
    earlier = (expert[:, None] == expert[None, :]) & (idx[None, :] < idx[:, None])
    tl.store(rank_ptr + offs, tl.sum(earlier.to(tl.int32), axis=1), mask=in_range)
    # An id outside [0, E) (a caller's bug) is not counted, so it is never placed.
    valid = in_range & (expert >= 0) & (expert < num_experts)
    counts = tl.histogram(expert, E_PAD, mask=valid)
    tl.store(counts_ptr + chunk * E_PAD + tl.arange(0, E_PAD), counts)


@triton.jit(do_not_specialize=["num_pairs", "num_chunks", "num_blocks", "blocks_per_program"])
def _moe_place_kernel(ids_ptr, rank_ptr, counts_ptr, sorted_ptr, block_expert_ptr,
                      num_pairs, num_experts, num_chunks, num_blocks, blocks_per_program,
                      E_PAD: tl.constexpr, CHUNK: tl.constexpr, COUNT_ROWS: tl.constexpr,
                      LABEL_BLOCKS: tl.constexpr, BLOCK_M: tl.constexpr):
    """Per chunk: place its pairs at their sorted positions; program 0 also fills each
    expert's padding rows with the sentinel num_pairs; each program labels its share of
    the blocks with their expert (num_experts past the used part)."""
    chunk = tl.program_id(0)
    experts = tl.arange(0, E_PAD)
    # Every program sums the whole count table (num_chunks x E_PAD, 256 KiB at 65,536 pairs
    # and 128 experts): each needs the totals and what the chunks before it hold.
    total = tl.zeros([E_PAD], dtype=tl.int32)
    before = tl.zeros([E_PAD], dtype=tl.int32)
    for c0 in range(0, num_chunks, COUNT_ROWS):
        rows = c0 + tl.arange(0, COUNT_ROWS)
        tile = tl.load(counts_ptr + rows[:, None] * E_PAD + experts[None, :],
                       mask=(rows < num_chunks)[:, None], other=0)
        total += tl.sum(tile, axis=0)
        before += tl.sum(tl.where((rows < chunk)[:, None], tile, 0), axis=0)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded

    idx = tl.arange(0, CHUNK)
    offs = chunk * CHUNK + idx
    in_range = offs < num_pairs
    expert = tl.load(ids_ptr + offs, mask=in_range, other=-1).to(tl.int32)
    valid = in_range & (expert >= 0) & (expert < num_experts)
    first = tl.sum(tl.where(expert[:, None] == experts[None, :], (starts + before)[None, :], 0),
                   axis=1)
    rank = tl.load(rank_ptr + offs, mask=valid, other=0)
    tl.store(sorted_ptr + first + rank, offs, mask=valid)

    if chunk == 0:
        pad = tl.arange(0, BLOCK_M)
        slots = (starts + total)[:, None] + pad[None, :]
        tl.store(sorted_ptr + slots, tl.zeros_like(slots) + num_pairs,
                 mask=slots < ends[:, None])

    first_block = chunk * blocks_per_program
    last_block = tl.minimum(first_block + blocks_per_program, num_blocks)
    for b0 in range(first_block, last_block, LABEL_BLOCKS):
        blocks = b0 + tl.arange(0, LABEL_BLOCKS)
        # A block's expert: how many experts' padded runs end at or before its first row.
        label = tl.sum((ends[None, :] <= (blocks * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + blocks, tl.minimum(label, num_experts),
                 mask=blocks < last_block)


@dataclass(frozen=True)
class SortedPairs:
    """The pairs grouped by expert: `pairs` int32 [num_blocks * block_m], each used block's
    pair indices (token * k + slot) for one expert, padding rows holding num_pairs;
    `block_expert` int32 [num_blocks], each block's expert, num_experts past the used
    part (those blocks' rows are unset)."""

    pairs: torch.Tensor
    block_expert: torch.Tensor
    block_m: int


def sort_pairs(ids: torch.Tensor, num_experts: int, block_m: int) -> SortedPairs:
    """Group the (token, slot) pairs of ids [T, k] by expert, each expert's run in pair
    order and padded to a multiple of block_m rows; no host synchronization."""
    flat = ids.reshape(-1)
    n = flat.numel()
    chunks = triton.cdiv(n, SORT_CHUNK)
    # At most min(E, n) experts have pairs, each padded by at most block_m - 1 rows.
    num_blocks = triton.cdiv(n + min(num_experts, n) * (block_m - 1), block_m)
    e_pad = max(16, next_power_of_2(num_experts))
    dev = ids.device
    rank = torch.empty(n, dtype=torch.int32, device=dev)
    counts = torch.empty(chunks, e_pad, dtype=torch.int32, device=dev)
    pairs = torch.empty(num_blocks * block_m, dtype=torch.int32, device=dev)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=dev)
    _moe_count_kernel[(chunks,)](flat, rank, counts, n, num_experts, E_PAD=e_pad,
                                 CHUNK=SORT_CHUNK, num_warps=4)
    _moe_place_kernel[(chunks,)](flat, rank, counts, pairs, block_expert, n, num_experts,
                                 chunks, num_blocks, triton.cdiv(num_blocks, chunks),
                                 E_PAD=e_pad, CHUNK=SORT_CHUNK, COUNT_ROWS=SORT_COUNT_ROWS,
                                 LABEL_BLOCKS=SORT_LABEL_BLOCKS, BLOCK_M=block_m, num_warps=4)
    return SortedPairs(pairs, block_expert, block_m)


# ---------------------------------------------------------------------------------------
# 2-3. The grouped GEMMs.


@triton.jit
def _e8m0_half(e8):
    """2**(e8 - 128) in float32, exactly (ggml's e8m0 'half' scale: the kvalues are
    doubled); e8 0 and 1 give subnormals."""
    e = e8.to(tl.int32)
    bits = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _e2m1_doubled(nibble):
    """An e2m1 code's value doubled, float32: 0 1 2 3 4 6 8 12 and their negatives."""
    q = nibble.to(tl.int32)
    exponent = (q >> 1) & 3
    mantissa = q & 1
    magnitude = tl.where(exponent == 0, mantissa, (2 + mantissa) << tl.maximum(exponent - 1, 0))
    return tl.where((q & 8) != 0, -magnitude, magnitude).to(tl.float32)


@triton.jit
def _load_rows(row_ptrs, row_ok, k0, K, MX: tl.constexpr, BLOCK_K: tl.constexpr):
    """One K step of the activation rows [BLOCK_M, ...]: dense, the BLOCK_K columns from k0
    (returned twice); MXFP4, [BLOCK_M, BLOCK_K / 2] twice: the columns that meet each
    32-block's low nibbles (its weights 0-15), then those that meet its high nibbles
    (16-31), the order _dot_weights dequantizes the weights in."""
    if MX:
        # [rows, blocks, 16]: runs of 16 columns the compiler sees as contiguous.
        blocks = k0 + tl.arange(0, BLOCK_K // 32) * 32
        lo = blocks[None, :, None] + tl.arange(0, 16)[None, None, :]
        mask = row_ok[:, None, None] & (blocks < K)[None, :, None]
        a_lo = tl.load(row_ptrs[:, None, None] + lo, mask=mask, other=0.0)
        a_hi = tl.load(row_ptrs[:, None, None] + lo + 16, mask=mask, other=0.0)
        shape: tl.constexpr = (row_ptrs.shape[0], BLOCK_K // 2)
        return tl.reshape(a_lo, shape), tl.reshape(a_hi, shape)
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(row_ptrs[:, None] + ks[None, :], mask=row_ok[:, None] & (ks < K)[None, :],
                    other=0.0)
        return a, a


@triton.jit
def _dot_weights(acc, a_lo, a_hi, w_row_ptrs, col_ok, k0, K,
                 MX: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc [BLOCK_N, BLOCK_M] += the weight rows at w_row_ptrs [BLOCK_N] (dense: element
    pointers; MXFP4: byte pointers to rows of blocks) times the K step's activations,
    transposed. The weights are the MMA's first operand: on sm_80/89 every warp holds the
    whole second operand, so as the second one each warp dequantized the whole weight tile
    (it took 255 registers and spilled); as the first each warp dequantizes its own rows,
    and a decode step's few tokens are the narrow side of the MMA."""
    if MX:
        # [columns, blocks, 16]: each 32-block's exponent byte, then its 16 nibble bytes.
        blocks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        mask = col_ok[:, None, None] & (blocks * 32 < K)[None, :, None]
        block_ptrs = w_row_ptrs[:, None, None] + (blocks * 17)[None, :, None]
        scale = _e8m0_half(tl.load(block_ptrs, mask=mask, other=0))
        nibbles = tl.load(block_ptrs + 1 + tl.arange(0, 16)[None, None, :], mask=mask, other=0)
        shape: tl.constexpr = (w_row_ptrs.shape[0], BLOCK_K // 2)
        w_lo = tl.reshape(_e2m1_doubled(nibbles & 15) * scale, shape).to(a_lo.dtype)
        w_hi = tl.reshape(_e2m1_doubled(nibbles >> 4) * scale, shape).to(a_lo.dtype)
        acc = tl.dot(w_lo, tl.trans(a_lo), acc, input_precision="ieee")
        acc = tl.dot(w_hi, tl.trans(a_hi), acc, input_precision="ieee")
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_row_ptrs[:, None] + ks[None, :], mask=col_ok[:, None] & (ks < K)[None, :],
                    other=0.0)
        # "ieee" matters for float32 only (no TF32); 16-bit inputs take the tensor cores.
        acc = tl.dot(w, tl.trans(a_lo), acc, input_precision="ieee")
    return acc


@triton.jit
def _rounded(v, dtype: tl.constexpr):
    """v rounded to the activation dtype, held in float32."""
    return v.to(dtype).to(tl.float32)


@triton.jit
def _add_bias(v, b_ptrs, col_ok, dtype: tl.constexpr):
    """The reference's h + b.to(dtype): the bias rounded, the sum rounded."""
    b = tl.load(b_ptrs, mask=col_ok, other=0.0)
    return _rounded(v + _rounded(b, dtype)[None, :], dtype)


@triton.jit
def _gated(gate, up, activation, alpha, limit, dtype: tl.constexpr):
    """kernels/reference/reference.py's gated activations on float32 tiles holding
    activation-dtype values: 0 silu, 1 gelu_tanh, 2 clamped_swiglu. A runtime choice, in
    the epilogue only: three compiled variants per tile set would cost compile time for
    nothing measurable."""
    if activation == 0:
        out = _rounded(gate / (1.0 + tl.exp(-gate)), dtype) * up
    elif activation == 1:
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        decay = tl.exp(-2.0 * tl.abs(inner))  # in (0, 1]: no overflow
        tanh = tl.where(inner < 0, -1.0, 1.0) * (1.0 - decay) / (1.0 + decay)
        out = _rounded(0.5 * gate * (1.0 + tanh), dtype) * up
    else:
        # Rounded where the reference's torch ops round: (up + 1), g * alpha, the sigmoid,
        # g * sigmoid.
        g = tl.minimum(gate, limit)
        u = tl.minimum(tl.maximum(up, -limit), limit)
        sig = _rounded(1.0 / (1.0 + tl.exp(-_rounded(g * alpha, dtype))), dtype)
        out = _rounded(u + 1.0, dtype) * _rounded(g * sig, dtype)
    return out


@triton.jit(do_not_specialize=["num_pairs", "top_k", "activation", "has_bias"])
def _moe_gate_up_kernel(x_ptr, w_ptr, b_ptr, h_ptr, sorted_ptr, block_expert_ptr,
                        num_pairs, top_k, num_experts, hidden, inter,
                        stride_x, stride_we, stride_wn, stride_be, stride_h,
                        activation, alpha, limit, has_bias,
                        MX: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr):
    """h[row] = act(x[token] @ gate^T + b_gate, x[token] @ up^T + b_up) for one block of
    sorted rows and BLOCK_N intermediate columns."""
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block)
    if expert >= num_experts:
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + rows)
    row_ok = pair < num_pairs
    # 64-bit offsets: gpt-oss-120b's stacked w13 passes 2**31 elements.
    x_rows = x_ptr + (pair // top_k).to(tl.int64) * stride_x
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inter
    w_expert = w_ptr + expert.to(tl.int64) * stride_we
    gate_rows = w_expert + cols.to(tl.int64) * stride_wn
    up_rows = w_expert + (cols + inter).to(tl.int64) * stride_wn
    acc_gate = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        a_lo, a_hi = _load_rows(x_rows, row_ok, k0, hidden, MX, BLOCK_K)
        acc_gate = _dot_weights(acc_gate, a_lo, a_hi, gate_rows, col_ok, k0, hidden, MX,
                                BLOCK_K)
        acc_up = _dot_weights(acc_up, a_lo, a_hi, up_rows, col_ok, k0, hidden, MX, BLOCK_K)
    dtype = h_ptr.dtype.element_ty
    gate = _rounded(tl.trans(acc_gate), dtype)
    up = _rounded(tl.trans(acc_up), dtype)
    if has_bias:
        b_expert = b_ptr + expert.to(tl.int64) * stride_be
        gate = _add_bias(gate, b_expert + cols, col_ok, dtype)
        up = _add_bias(up, b_expert + inter + cols, col_ok, dtype)
    h = _gated(gate, up, activation, alpha, limit, dtype)
    tl.store(h_ptr + rows.to(tl.int64)[:, None] * stride_h + cols[None, :], h.to(dtype),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=["num_pairs", "has_bias"])
def _moe_down_kernel(h_ptr, w_ptr, b_ptr, y_ptr, route_ptr, sorted_ptr, block_expert_ptr,
                     num_pairs, num_experts, inter, hidden,
                     stride_h, stride_we, stride_wn, stride_be, stride_y, has_bias,
                     MX: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """y[pair] = route[pair] * (h[row] @ w2^T + b2) for one block of sorted rows and
    BLOCK_N hidden columns."""
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block)
    if expert >= num_experts:
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + rows)
    row_ok = pair < num_pairs
    h_rows = h_ptr + rows.to(tl.int64) * stride_h
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    w_rows = w_ptr + expert.to(tl.int64) * stride_we + cols.to(tl.int64) * stride_wn
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        a_lo, a_hi = _load_rows(h_rows, row_ok, k0, inter, MX, BLOCK_K)
        acc = _dot_weights(acc, a_lo, a_hi, w_rows, col_ok, k0, inter, MX, BLOCK_K)
    dtype = y_ptr.dtype.element_ty
    out = _rounded(tl.trans(acc), dtype)
    if has_bias:
        out = _add_bias(out, b_ptr + expert.to(tl.int64) * stride_be + cols, col_ok, dtype)
    route = tl.load(route_ptr + pair, mask=row_ok, other=0.0)
    out = out * _rounded(route, dtype)[:, None]
    tl.store(y_ptr + pair.to(tl.int64)[:, None] * stride_y + cols[None, :], out.to(dtype),
             mask=row_ok[:, None] & col_ok[None, :])


# ---------------------------------------------------------------------------------------
# The wrapper.


def _check_weights(w: torch.Tensor, fmt: int | None, rows: int, k: int, dtype: torch.dtype,
                   name: str) -> bool:
    """Validate one stacked weight ([E, rows, k] dense in x's dtype, or MXFP4 rows of
    k / 32 blocks); True for MXFP4."""
    if fmt is None:
        if w.dtype != dtype or w.dim() != 3 or tuple(w.shape[1:]) != (rows, k):
            raise ValueError(f"{name} {tuple(w.shape)} {w.dtype}: need [E, {rows}, {k}] {dtype}")
        check_last_dim_contiguous(w)
        return False
    if fmt != MXFP4:
        raise ValueError(f"{name}: GGUF type {fmt} has no Triton kernel; MXFP4 ({MXFP4}) or "
                         "dense weights only")
    width = k // MXFP4_BLOCK_WEIGHTS * MXFP4_BLOCK_BYTES
    if k % MXFP4_BLOCK_WEIGHTS or w.dtype != torch.uint8 or w.dim() != 3 or \
            tuple(w.shape[1:]) != (rows, width):
        raise ValueError(f"{name} {tuple(w.shape)} {w.dtype}: need MXFP4 rows uint8 "
                         f"[E, {rows}, {width}] (K = {k}, a multiple of 32)")
    check_last_dim_contiguous(w)
    return True


def _check_bias(b: torch.Tensor | None, experts: int, n: int, name: str) -> None:
    if b is not None and (b.dtype != torch.float32 or tuple(b.shape) != (experts, n)
                          or b.stride(-1) != 1):
        raise ValueError(f"{name} {tuple(b.shape)} {b.dtype}: need float32 [{experts}, {n}] "
                         "contiguous rows")


def moe_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                experts: ExpertWeights, activation: ExpertActivation, *,
                tiles: MoETiles | None = None) -> torch.Tensor:
    """sum over k of weights[t, k] * expert_{ids[t, k]}(x[t]) for x [T, H] (fp16, bf16 or
    fp32), weights float32 [T, k], ids [T, k] in [0, E); [T, H] in x's dtype
    (kernels/reference/moe.py's semantics; its numerics: the module docstring). Expert
    weights dense in x's dtype or MXFP4 blocks (fmt13/fmt2 == MXFP4). `tiles` overrides
    moe_tiles' choice (tests, benchmarks). No host synchronization: CUDA-graph safe. An id
    outside [0, E) is not checked (that would synchronize): the sort skips its pair, so no
    memory outside the buffers is touched, but its token's output is undefined.

    Scratch, besides the sort's int32 vectors: the activated rows [R, I] with R = T*k +
    min(E, T*k) * (BLOCK_M - 1) rows (the padded bound) and the per-slot outputs [T*k, H],
    both in x's dtype: 113 MB and 268 MB at 8,192 tokens of Qwen3-30B-A3B."""
    if x.dim() != 2 or x.dtype not in DTYPES:
        raise ValueError(f"x {tuple(x.shape)} {x.dtype}: need [T, H] in one of {DTYPES}")
    check_last_dim_contiguous(x)
    t, hidden = x.shape
    if weights.shape != ids.shape or ids.dim() != 2 or ids.shape[0] != t:
        raise ValueError(f"weights {tuple(weights.shape)} and ids {tuple(ids.shape)}: need "
                         f"both [{t}, k]")
    num_experts, inter = experts.num_experts, experts.intermediate_size
    mx13 = _check_weights(experts.w13, experts.fmt13, 2 * inter, hidden, x.dtype, "w13")
    mx2 = _check_weights(experts.w2, experts.fmt2, hidden, inter, x.dtype, "w2")
    if experts.w2.shape[0] != num_experts:
        raise ValueError(f"w13 has {num_experts} experts, w2 {experts.w2.shape[0]}")
    _check_bias(experts.b13, num_experts, 2 * inter, "b13")
    _check_bias(experts.b2, num_experts, hidden, "b2")
    if activation.kind not in ACTIVATIONS:
        raise ValueError(f"unknown expert activation {activation.kind!r}")
    top_k = ids.shape[1]
    n = t * top_k
    if n == 0:
        return torch.zeros_like(x)
    tiles = tiles or moe_tiles(n, num_experts, x.dtype, mx13 or mx2)
    sorted_pairs = sort_pairs(ids, num_experts, tiles.block_m)
    num_blocks = sorted_pairs.block_expert.numel()
    launch = dict(MX=False, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                  BLOCK_K=tiles.block_k, num_warps=tiles.num_warps, num_stages=tiles.num_stages)

    h = torch.empty(num_blocks * tiles.block_m, inter, dtype=x.dtype, device=x.device)
    w13, b13 = experts.w13, experts.b13
    _moe_gate_up_kernel[(num_blocks, triton.cdiv(inter, tiles.block_n))](
        x, w13, b13 if b13 is not None else h, h, sorted_pairs.pairs, sorted_pairs.block_expert,
        n, top_k, num_experts, hidden, inter,
        x.stride(0), w13.stride(0), w13.stride(1), b13.stride(0) if b13 is not None else 0,
        h.stride(0), ACTIVATIONS[activation.kind], activation.alpha, activation.limit,
        int(b13 is not None), **dict(launch, MX=mx13))

    y = torch.empty(n, hidden, dtype=x.dtype, device=x.device)
    w2, b2 = experts.w2, experts.b2
    route = weights.reshape(-1).to(torch.float32).contiguous()
    _moe_down_kernel[(num_blocks, triton.cdiv(hidden, tiles.block_n))](
        h, w2, b2 if b2 is not None else h, y, route, sorted_pairs.pairs,
        sorted_pairs.block_expert, n, num_experts, inter, hidden,
        h.stride(0), w2.stride(0), w2.stride(1), b2.stride(0) if b2 is not None else 0,
        y.stride(0), int(b2 is not None), **dict(launch, MX=mx2))
    # The k slots of a token: torch accumulates a 16-bit sum in float32, without atomics.
    return y.view(t, top_k, hidden).sum(dim=1)
