"""Bound oneDNN's per-shape caches on the CPU, before torch first uses them.

Continuous batching gives almost every step a new shape (decodes plus a prefill chunk of any
length), and on the CPU each new shape of a bf16 matmul gets a compiled oneDNN primitive,
cached in oneDNN's primitive cache and in PyTorch's (ideep's) LRU cache, 1,024 entries each by
default. Found by the soak (benchmarks/soak.py): resident memory grew about 1.7 MiB per request
for as long as it ran. Capacities of 64 keep it flat at no measured cost in speed
(docs/security.md, "Soak"); see also pytorch/pytorch#98688. An operator's own setting wins.
"""

from __future__ import annotations

import os

CACHE_CAPACITY = "64"


def bound_cpu_kernel_caches() -> None:
    """Set the cache capacities unless the environment already does."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", CACHE_CAPACITY)
    os.environ.setdefault("LRU_CACHE_CAPACITY", CACHE_CAPACITY)
