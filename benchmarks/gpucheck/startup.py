"""(e) The engine's start-up lines (memory profiling, realized pool, concurrency) and its pool
against `officellm plan`'s for the memory that was free when it started."""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch

from officellm.engine import make_plan


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def capture_engine_logs():
    """Collect the INFO lines the engine logs while the block runs."""
    handler = _Collect()
    root = logging.getLogger("engine")
    old = root.level
    root.setLevel(logging.INFO)
    root.addHandler(handler)
    try:
        yield handler.lines
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


def memory_held(device: torch.device) -> int:
    """Bytes of the GPU already taken before the engine starts (the CUDA context, the check's
    transformers model); 0 on the CPU."""
    if device.type != "cuda":
        return 0
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def plan_memory(engine, device: torch.device, held_before: int) -> int:
    """What `officellm plan --memory` should be given for this start: on CUDA the engine's
    share of the GPU less what others held when it started; on the CPU the plan's weights
    plus the fixed --kv-cache-memory."""
    config = engine.config
    if device.type == "cuda":
        _, total = torch.cuda.mem_get_info(device)
        return int(total * config.gpu_memory_utilization) - held_before
    weights = make_plan(engine.engine_core.spec, engine.model_name, 0, "bf16").weight_bytes
    return weights + int(config.kv_cache_memory or 0)


def summarize(engine, lines: list[str], seconds: float, device: torch.device,
              held_before: int) -> dict:
    """The start-up numbers; `held_before`: memory_held() just before the engine started.
    pool_vs_plan is the realized pool over the plan's (the plan knows no activations, CUDA
    graphs or allocator slack: the target is within 5 %)."""
    s = engine.stats()
    core = engine.engine_core
    memory = plan_memory(engine, device, held_before)
    plan = make_plan(core.spec, engine.model_name, memory, "bf16",
                     kv_cache_dtype=s.kv_cache_dtype)
    return {
        "plan_memory_bytes": memory,
        "plan_pool_tokens": plan.pool_tokens,
        "pool_vs_plan": s.kv_cache_tokens / plan.pool_tokens if plan.pool_tokens else None,
        "log": lines,
        "startup_seconds": seconds,
        "kv_cache_tokens": s.kv_cache_tokens,
        "num_blocks": s.num_blocks_total,
        "bytes_per_token": s.bytes_per_token,
        "max_model_len": s.max_model_len,
        "max_concurrency_at_32k": s.kv_cache_tokens / 32768,
        "cuda_graphs": engine.engine_core.runner.decode_graphs is not None,
        "backend": engine.engine_core.backend,
    }
