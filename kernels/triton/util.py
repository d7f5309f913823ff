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


def check_cache_rows(k_cache: torch.Tensor, v_cache: torch.Tensor, head_dim: int) -> bool:
    """Check the KV caches' layout for queries of head_dim; True when they are int8 (rows of
    head_dim values, then a float32 scale: kernels/reference/reference.py)."""
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("KV caches must be contiguous")
    int8 = k_cache.dtype == torch.int8
    width = head_dim + 4 if int8 else head_dim
    if k_cache.shape[-1] != width or v_cache.shape[-1] != width or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"KV cache rows of {k_cache.shape[-1]} {k_cache.dtype} do not hold "
                         f"head_dim {head_dim}")
    return int8


def check_window_and_sinks(window: int, sinks: torch.Tensor | None, q_heads: int) -> None:
    """A sliding window is 0 (none) or a number of keys; sinks are one float32 logit per
    query head, contiguous, on the queries' device."""
    if window < 0:
        raise ValueError(f"window must be 0 (none) or a number of keys, got {window}")
    if sinks is not None and (sinks.dtype != torch.float32 or sinks.shape != (q_heads,)
                              or not sinks.is_contiguous()):
        raise ValueError(f"sinks must be float32 [{q_heads}], got {sinks.dtype} "
                         f"{tuple(sinks.shape)}")
