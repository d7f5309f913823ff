"""The Triton kernels for CUDA. Each module is imported only on demand, so the CPU engine never
needs Triton installed; this package's own import does not import Triton."""

from __future__ import annotations

import importlib.util

# Triton compiles float8 e4m3 (its fp8e4nv) only for compute capability 8.9 and newer: the
# engine refuses an e4m3 cache below it, and the compile check does not build one there.
E4M3_MIN_CAPABILITY = (8, 9)


def triton_available() -> bool:
    """Whether Triton can be imported (it is not on every CPU-only install)."""
    return importlib.util.find_spec("triton") is not None
