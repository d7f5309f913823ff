"""Host values onto the device without making the host wait for the device.

On CUDA a copy from ordinary (pageable) host memory is synchronous: the host blocks until
every kernel queued before the copy has run, so each `torch.tensor(list, device="cuda")` in
the step loop is a hidden sync. A copy from pinned memory with non_blocking=True is queued
like a kernel instead; torch's caching host allocator keeps each pinned buffer until its copy
has run, so the next step may stage into a new one at once. On the CPU both are the plain
host tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def to_device(values: Sequence | np.ndarray | torch.Tensor, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    """`values` as a `dtype` tensor on `device`, queued without waiting for the device."""
    host = torch.as_tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def stage_int64(arrays: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """Several int64 host arrays on `device` through one buffer and one copy; returns 1-D
    views of it, one per array, in order."""
    sizes = [a.size for a in arrays]
    packed = np.concatenate([a.ravel() for a in arrays]) if arrays else \
        np.empty(0, dtype=np.int64)
    on_device = to_device(packed.astype(np.int64, copy=False), torch.int64, device)
    return list(on_device.split(sizes))
