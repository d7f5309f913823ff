"""Which kernel implementations the model calls on a given device."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from kernels import reference


def ops_for(device: torch.device) -> SimpleNamespace:
    """The reference (torch) ops; the Triton ones replace them on CUDA when available."""
    return SimpleNamespace(
        rms_norm=reference.rms_norm,
        fused_add_rms_norm=reference.fused_add_rms_norm,
        apply_rotary=reference.apply_rotary,
        silu_and_mul=reference.silu_and_mul,
    )
