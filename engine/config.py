"""Engine configuration in one typed place."""

from __future__ import annotations

import re
from dataclasses import dataclass

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4,
}


def parse_memory(value: str | int | float) -> int:
    """Parse "4GiB", "512MiB", "2.5GB" or a plain byte count into bytes."""
    if isinstance(value, (int, float)):
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"Cannot read a memory size from {value!r}; use e.g. 4GiB, 512MiB.")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_gib(num_bytes: float) -> str:
    return f"{num_bytes / 1024**3:.2f} GiB"


@dataclass
class EngineConfig:
    """Everything the engine needs to start. Names follow vLLM's flags."""

    model: str | None = None  # HF directory, .gguf file; None = the bundled SmolLM2
    device: str = "cpu"
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    max_model_len: int | None = None
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    kv_cache_memory: int | str | None = None  # bytes or "4GiB"; CPU pool size
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    tensor_parallel_size: int = 1
    num_threads: int | None = None  # CPU threads; None = all cores
    attention_backend: str | None = None  # torch | cpu | triton; None = by device
    enforce_eager: bool = False  # CUDA: no decode CUDA graphs (vLLM's --enforce-eager)
    stats_log_interval: float = 5.0  # seconds between periodic stats lines while busy
    # While decodes run, size prefill chunks so a step costs about this many decode-only
    # steps (engine/prefill_pacer.py); None = the token budget alone decides.
    prefill_pacing: float | None = None

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}.")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1.")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be at least 1.")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1].")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len must be at least 2.")
        if self.prefill_pacing is not None and self.prefill_pacing <= 1:
            raise ValueError("prefill_pacing must be above 1 (a decode-only step is 1).")
        if self.tensor_parallel_size < 1:
            raise ValueError("tensor_parallel_size must be at least 1.")
        if self.tensor_parallel_size > 1 and ":" in self.device:
            raise ValueError(f"With tensor_parallel_size > 1 give the device without an index "
                             f"(rank r uses cuda:r), not {self.device!r}.")
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_memory(self.kv_cache_memory)
