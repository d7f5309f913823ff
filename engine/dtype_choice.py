"""Which dtype `--dtype auto` means on this machine."""

from __future__ import annotations

import functools
import logging
import time

import torch

from officellm.kernels.cpu_features import cpu_features

logger = logging.getLogger("officellm.engine.dtype_choice")

NAMES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


def _time_linear(dtype: torch.dtype, m: int, k: int, n: int, repeats: int = 7) -> float:
    """The fastest of `repeats` calls: what this CPU can do, not what a neighbour's burst
    left of it (a total over five calls once measured bf16 at 1.1x fp32 on a CPU where it is
    2.3x, and the server ran in float32)."""
    x = torch.randn(m, k).to(dtype)
    w = torch.randn(n, k).to(dtype)
    for _ in range(2):
        torch.nn.functional.linear(x, w)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.nn.functional.linear(x, w)
        best = min(best, time.perf_counter() - t0)
    return best


@functools.cache
def _measured_speeds(shape: tuple[int, int, int]) -> tuple[float, float]:
    """fp32's and bf16's time for a matmul of `shape`, measured once per process: a model
    loaded again (a wake from idle sleep, a reload in the model pool) gets the dtype it got
    at first, not a new draw of the timing noise."""
    return _time_linear(torch.float32, *shape), _time_linear(torch.bfloat16, *shape)


def resolve_dtype(requested: str, device: torch.device, config_dtype: str | None,
                  hidden_size: int = 1024, intermediate_size: int = 4096) -> torch.dtype:
    """Map a --dtype value to a torch dtype.

    auto on CUDA: the checkpoint's half type (bf16 when it says float32). auto on the CPU:
    bf16 when the CPU has bf16 matrix instructions and a matmul of the model's shape
    actually runs faster in bf16 than fp32 (measured here in ~tens of ms); else fp32.
    """
    if requested != "auto":
        try:
            return NAMES[requested.lower()]
        except KeyError:
            raise ValueError(f"Unknown dtype {requested!r}; use auto, float32, bfloat16 or float16.") from None
    if device.type == "cuda":
        cfg = NAMES.get((config_dtype or "").lower(), torch.bfloat16)
        return cfg if cfg != torch.float32 else torch.bfloat16
    features = cpu_features()
    if not features.has_bf16_compute:
        logger.info("dtype auto -> float32: this CPU (%s) has no bf16 matrix instructions "
                    "(AVX512-BF16 or AMX), so bf16 would be emulated", features.describe())
        return torch.float32
    shape = (32, hidden_size, 2 * intermediate_size)
    fp32, bf16 = _measured_speeds(shape)
    choice = torch.bfloat16 if bf16 < 0.8 * fp32 else torch.float32
    logger.info("dtype auto -> %s: this CPU (%s) has bf16 matrix instructions, and a "
                "%dx%dx%d matmul measured here runs in bf16 at %.1fx the speed of fp32 "
                "(bf16 is chosen from 1.25x)", str(choice).removeprefix("torch."),
                features.describe(), *shape, fp32 / max(bf16, 1e-9))
    return choice
