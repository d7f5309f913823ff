"""Compute kernels: Triton for CUDA, torch references for the CPU (and as the tests' truth).

The Triton modules (`kernels.triton_*`) are imported only on demand, so the CPU engine never
needs Triton installed.
"""

from __future__ import annotations

import importlib.util

from kernels import reference


def triton_available() -> bool:
    """Whether Triton can be imported (it is not on every CPU-only install)."""
    return importlib.util.find_spec("triton") is not None


__all__ = ["reference", "triton_available"]
