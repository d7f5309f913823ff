"""Compute kernels: Triton for CUDA, torch references for the CPU (and as the tests' truth)."""

from kernels import reference

__all__ = ["reference"]
