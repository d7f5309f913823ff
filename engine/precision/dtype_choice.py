"""Which dtype `--dtype auto` means on this machine."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from officellm.engine.precision.measured_choice import machine_key, remembered
from officellm.kernels.cpu_features import cpu_features

logger = logging.getLogger("officellm.engine.precision.dtype_choice")

BF16_FROM = 1.25  # bf16's speed over fp32's from which auto picks bf16

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


# _measured_speedup's answers, by matmul shape and machine (engine/precision/measured_choice.py): two
# starts of one model on one machine choose the same dtype, so give the same answers.
CHOICES_FILE = "dtype_choices.json"


def _measured_speedup(shape: tuple[int, int, int], cache_dir: Path | None = None
                      ) -> tuple[float, Path | None]:
    """bf16's speed over fp32's for a matmul of `shape`, as first measured on this machine,
    and the file it was kept in (None: measured now)."""

    def measure() -> float:
        fp32, bf16 = _time_linear(torch.float32, *shape), _time_linear(torch.bfloat16, *shape)
        return fp32 / max(bf16, 1e-9)

    key = "|".join(["x".join(map(str, shape)), *machine_key()])
    return remembered(CHOICES_FILE, key, measure, cache_dir)


def resolve_dtype(requested: str, device: torch.device, config_dtype: str | None,
                  hidden_size: int = 1024, intermediate_size: int = 4096,
                  cache_dir: Path | None = None) -> torch.dtype:
    """Map a --dtype value to a torch dtype.

    auto on CUDA: the checkpoint's half type (bf16 when it says float32). auto on the CPU:
    bf16 when the CPU has bf16 matrix instructions and a matmul of the model's shape
    actually runs faster in bf16 than fp32 (measured in ~tens of ms at the first start on
    this machine, then kept in `cache_dir`: engine/precision/measured_choice.py); else fp32.
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
    speedup, kept_in = _measured_speedup(shape, cache_dir)
    choice = torch.bfloat16 if speedup > BF16_FROM else torch.float32
    logger.info("dtype auto -> %s: this CPU (%s) has bf16 matrix instructions, and a "
                "%dx%dx%d matmul runs in bf16 at %.1fx the speed of fp32 (bf16 is chosen "
                "from %.2fx); %s", str(choice).removeprefix("torch."), features.describe(),
                *shape, speedup, BF16_FROM,
                "measured now" if kept_in is None else
                f"as measured at the first start on this machine (delete {kept_in} to "
                f"measure again)")
    return choice
