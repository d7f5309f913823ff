"""The gated MLPs' activations in Triton: SiLU-and-mul and GELU(tanh)-and-mul (Gemma's
GeGLU)."""

from __future__ import annotations

import torch

import triton
import triton.language as tl
from officellm.kernels.triton.util import check_last_dim_contiguous

BLOCK = 1024


@triton.jit
def _gated_activation_kernel(x_ptr, out_ptr, stride_x, n_cols, BLOCK: tl.constexpr,
                             GELU: tl.constexpr):
    # 64-bit row offsets: row * stride passes 2**31 elements at ~57k tokens of a 7B's MLP.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    if GELU:
        # 0.5 g (1 + tanh(u)) = g sigmoid(2u), u = sqrt(2 / pi) (g + 0.044715 g^3): no tanh
        # in Triton's core language, and the sigmoid form has no cancellation near 0. The
        # exp is of -2|u| (never overflows: u is cubic in g).
        u = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        e = tl.exp(-2.0 * tl.abs(u))
        act = g * tl.where(u >= 0, 1.0, e) / (1.0 + e)
    else:
        act = g / (1.0 + tl.exp(-g))
    # torch rounds the activation to the input dtype before the multiply; do the same.
    act = act.to(gate.dtype).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (act * up.to(tl.float32)).to(gate.dtype), mask=mask)


def _gated(x: torch.Tensor, gelu: bool) -> torch.Tensor:
    check_last_dim_contiguous(x)
    half = x.shape[-1] // 2
    x2 = x.reshape(-1, x.shape[-1])
    out = torch.empty((*x.shape[:-1], half), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        grid = (x2.shape[0], triton.cdiv(half, BLOCK))
        _gated_activation_kernel[grid](x2, out, x2.stride(0), half, BLOCK=BLOCK, GELU=gelu,
                                       num_warps=4)
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2I] holding gate then up -> silu(gate) * up, [..., I]."""
    return _gated(x, gelu=False)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2I] holding gate then up -> gelu(gate, tanh approximation) * up, [..., I]."""
    return _gated(x, gelu=True)
