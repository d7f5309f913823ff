"""Compute kernels: Triton for CUDA, C++ for the CPU, torch references (the tests' truth).

- kernels/cpu/: the C++ CPU kernels, by operation (and the quantized matmul by ISA path);
  kernels/build/ compiles them into one module on first use (kernels/build/cpu_kernels.py)
- kernels/triton/: the Triton kernels, imported only on demand, so the CPU engine never
  needs Triton installed
- kernels/reference/: the torch references of every op
- kernels/ops.py: KernelOps, the per-layer ops the model calls, for one backend
- kernels/cpu_features.py: what this CPU can run
"""

from __future__ import annotations

import importlib.util


def triton_available() -> bool:
    """Whether Triton can be imported (it is not on every CPU-only install)."""
    return importlib.util.find_spec("triton") is not None


__all__ = ["triton_available"]
