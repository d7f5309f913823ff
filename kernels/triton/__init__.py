"""The Triton kernels for CUDA. Each module is imported only on demand, so the CPU engine never
needs Triton installed; this package's own import does not import Triton."""

from __future__ import annotations

import importlib.util


def triton_available() -> bool:
    """Whether Triton can be imported (it is not on every CPU-only install)."""
    return importlib.util.find_spec("triton") is not None
