"""This machine's memory, as the engine sizes itself by it: what can still be allocated,
what the process holds, and handing back what it freed."""

from __future__ import annotations

import ctypes
import gc
import os
from pathlib import Path

import torch


def available_memory_bytes() -> int:
    """The machine's free memory now (the page cache not counted), else 4 GiB."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 4 * 1024**3


def resident_memory_bytes() -> int | None:
    """This process's resident set size now (Linux /proc/self/statm); None where unknown."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def release_freed_memory() -> None:
    """Hand what Python and torch freed back to the system: the GPU's cached blocks to the
    device, and on Linux the heap's free pages (glibc keeps them otherwise, and the
    process's resident memory would not drop)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator returns what it returns
        pass
