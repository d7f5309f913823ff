"""The per-layer ops on the CPU: the compiled fused kernels where the layout allows, the torch
references elsewhere (same signatures as kernels/reference.py, same numbers)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from kernels import reference


def make_ops(module: Any) -> SimpleNamespace:
    """rms_norm / fused_add_rms_norm / apply_rotary / silu_and_mul / quant_matmul (and
    quant_pack, its weights' layout) over the compiled `module`."""

    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # Per-head q/k norms (Qwen3) see [T, H, D] views with uneven strides: the reference.
        if x.dim() == 2 and x.stride(1) == 1 and weight.dtype == x.dtype:
            return module.rms_norm(x, weight, eps)
        return reference.rms_norm(x, weight, eps)

    def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dim() == 2 and x.dtype == residual.dtype == weight.dtype:
            return module.fused_add_rms_norm(x, residual, weight, eps)
        return reference.fused_add_rms_norm(x, residual, weight, eps)

    def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if cos.dtype == torch.float32 and _heads_contiguous(q) and _heads_contiguous(k):
            return module.apply_rotary(q, k, cos, sin)
        return reference.apply_rotary(q, k, cos, sin)

    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.stride(1) == 1:
            return module.silu_and_mul(x)
        return reference.silu_and_mul(x)

    return SimpleNamespace(rms_norm=rms_norm, fused_add_rms_norm=fused_add_rms_norm,
                           apply_rotary=apply_rotary, silu_and_mul=silu_and_mul,
                           quant_matmul=module.quant_matmul, quant_pack=module.quant_pack)


def _heads_contiguous(t: torch.Tensor) -> bool:
    return t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2]
