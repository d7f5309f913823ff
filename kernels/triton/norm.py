"""Fused RMSNorm (optionally with the residual add) in Triton.

Rounding mirrors kernels.reference.reference exactly: the sum of x and the residual is rounded to the
input dtype, the normalized row (computed in float32) is rounded to the input dtype, and only
then multiplied by the weight, as Hugging Face's Llama/Qwen RMSNorm does.
"""

from __future__ import annotations

import torch

import triton
import triton.language as tl
from officellm.kernels.triton.util import check_last_dim_contiguous, next_power_of_2


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    n_inner, stride_x0, stride_x1, stride_r0, stride_r1,
    n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    # A row is addressed by two strides so that [T, H, D] views (q/k heads) need no copy.
    row = tl.program_id(0).to(tl.int64)  # 64-bit offsets: rows * stride may pass 2**31
    r0 = row // n_inner
    r1 = row % n_inner
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + r0 * stride_x0 + r1 * stride_x1 + cols, mask=mask, other=0.0)
    h = x.to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + r0 * stride_r0 + r1 * stride_r1 + cols, mask=mask, other=0.0)
        # Round the sum to the activation dtype first: the residual stream lives in that dtype.
        summed = (h + r.to(tl.float32)).to(x.dtype)
        tl.store(res_out_ptr + row * n_cols + cols, summed, mask=mask)
        h = summed.to(tl.float32)
    var = tl.sum(h * h, axis=0) / n_cols
    normed = (h * tl.rsqrt(var + eps)).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    check_last_dim_contiguous(x, weight)
    if residual is not None:
        check_last_dim_contiguous(residual)
    n = x.shape[-1]
    lead = x.shape[:-1]
    # Rows are (outer, inner) pairs: a 3-D [T, H, D] view keeps its own two strides.
    if x.dim() == 3:
        n_inner, sx = x.shape[1], (x.stride(0), x.stride(1))
        sr = (residual.stride(0), residual.stride(1)) if residual is not None else (0, 0)
    else:
        x2 = x.reshape(-1, n)
        n_inner, sx = 1, (x2.stride(0), 0)
        x = x2
        if residual is not None:
            residual = residual.reshape(-1, n)
        sr = (residual.stride(0), 0) if residual is not None else (0, 0)
    rows = x.numel() // n if x.numel() else 0
    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    out = torch.empty((*lead, n), dtype=out_dtype, device=x.device)
    res_out = torch.empty((*lead, n), dtype=x.dtype, device=x.device) if residual is not None else out
    if rows:
        block = next_power_of_2(n)
        _rms_norm_kernel[(rows,)](
            x, residual if residual is not None else x, weight, out, res_out,
            n_inner, sx[0], sx[1], sr[0], sr[1], n, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=block,
            num_warps=min(8, max(1, block // 256)),
        )
    return out, res_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension of a 2-D or 3-D tensor; same result as the reference."""
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual <- x + residual; return (rms_norm(residual), residual), in one pass."""
    if residual.dtype != x.dtype:
        raise ValueError("x and residual must share a dtype")
    return _launch(x, residual, weight, eps)
