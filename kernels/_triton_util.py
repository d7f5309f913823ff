"""Small helpers shared by the Triton kernel wrappers (no Triton import here)."""

from __future__ import annotations

import torch


def next_power_of_2(n: int) -> int:
    """tl.arange needs power-of-two extents; pad a dimension up to one."""
    return 1 << max(0, (int(n) - 1).bit_length())


def check_last_dim_contiguous(*tensors: torch.Tensor) -> None:
    """The kernels index rows by stride but assume unit stride inside a row."""
    for t in tensors:
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"last dimension must be contiguous, got strides {t.stride()}")
