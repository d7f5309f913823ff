"""Memory copy bandwidth measured in the same run: the denominator of every floor."""

from __future__ import annotations

import time

import torch


def copy_bandwidth(device: torch.device, nbytes: int = 2 * 1024**3, iters: int = 10) -> float:
    """Bytes moved per second (read + write) copying a buffer far larger than the L2."""
    n = nbytes // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src)
        seconds = time.perf_counter() - t0
    del src, dst
    return 2 * n * 2 * iters / seconds
