"""A batch-invariant dense matmul (y = x @ weight.T + bias) in Triton, for --batch-invariant.

In that mode a request's output must be bit-identical whatever else shares its batch. cuBLAS
does not give that: the kernel and split-K it picks depend on M (the rows in the batch), so
one row's sum over K is taken in an order, and rounded, differently as the batch changes.
Here every output element is reduced the same way for any M: one tile configuration per
dtype, chosen without looking at M, no split-K, no autotuning, and K walked tile by tile
from 0 to K, each tile's product added onto one float32 accumulator. The tile a row falls in,
and what the other rows of the tile hold, do not enter its arithmetic.

The cost, not yet measured on a GPU: a fixed tile is too large for decode (most of a 64-row
tile is masked at one token) and too small to be fastest at long prefills, and without
split-K a decode matmul runs on N / BLOCK_N blocks (72 for Qwen2.5-7B's qkv, 15 for
SmolLM2's), fewer than an H100 has SMs, so it cannot draw the full memory bandwidth. Expect
it slower than cuBLAS in both regimes: the price of the mode, paid only when it is asked for.
"""

from __future__ import annotations

import torch

import triton
import triton.language as tl

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) by dtype, never by shape. 16-bit inputs
# go to the tensor cores: a 64x64 float32 accumulator over 4 warps is 32 registers a thread,
# and a stage of 64-deep operand tiles is 16 KiB of shared memory (32-48 KiB in all, within
# sm_89's 99 KiB; no variant spills: compile_check). float32 in IEEE precision has no
# tensor-core path and runs as FMAs; a 32-deep K tile keeps its stage at 16 KiB too.
TILES: dict[torch.dtype, tuple[int, int, int, int, int]] = {
    torch.float16: (64, 64, 64, 4, 3),
    torch.bfloat16: (64, 64, 64, 4, 3),
    torch.float32: (64, 64, 32, 4, 3),
}


# M is not specialized on: Triton would otherwise compile separate kernels for M == 1 and for
# M divisible by 16, and a row's result would come from different code as the batch changed.
@triton.jit(do_not_specialize=["M"])
def _fixed_order_matmul_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K,
                               stride_xm, stride_wn, stride_ym,
                               HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    # 64-bit offsets: a large vocabulary's lm_head (N * K) passes 2**31 elements.
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + ks[None, :]
    w_ptrs = w_ptr + cols.to(tl.int64)[None, :] * stride_wn + ks[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + ks) < K
        # Rows past M read 0 and are never stored; K past its end reads 0, adding exact zeros.
        a = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        # "ieee" matters for float32 only (no TF32: the fp32 engine is held to transformers'
        # output); 16-bit inputs take the tensor cores either way.
        acc = tl.dot(a, b, acc, input_precision="ieee")
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def fixed_order_matmul(x: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T (+ bias [N]) -> [M, N] in x's dtype, accumulated in float32,
    each row's result bit-identical for any M and any other rows (see the module docstring)."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)} are not "
                         "[M, K] and [N, K]")
    if x.dtype not in TILES or weight.dtype != x.dtype:
        raise ValueError(f"x {x.dtype} and weight {weight.dtype}: need one of "
                         f"{', '.join(map(str, TILES))} for both")
    if weight.shape[1] > 1 and weight.stride(1) != 1:
        # A copy per call would hide itself in every forward; the weights are stored contiguous.
        raise ValueError(f"weight must be contiguous along K, got strides {weight.stride()}")
    if bias is not None and (bias.shape != (weight.shape[0],) or not bias.is_contiguous()):
        raise ValueError(f"bias {tuple(bias.shape)} is not a contiguous [{weight.shape[0]}]")
    m, k = x.shape
    n = weight.shape[0]
    if k > 1 and x.stride(1) != 1:
        x = x.contiguous()
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    block_m, block_n, block_k, warps, stages = TILES[x.dtype]
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _fixed_order_matmul_kernel[grid](
        x, weight, bias if bias is not None else y, y, m, n, k,
        x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps, num_stages=stages)
    return y
