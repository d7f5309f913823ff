"""How much memory a model will take once loaded, before loading it: its weights and its KV
pool, by `officellm plan`'s arithmetic. The server's model pool plans loads and unloads
against a memory budget with it (several models on one machine)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from officellm.engine.config import EngineConfig
from officellm.engine.host_memory import available_memory_bytes
from officellm.engine.kv_offload.disk_tier import disk_tier_memory_bytes
from officellm.engine.kv_offload.host_tier import host_tier_bytes
from officellm.engine.kv_plan import gguf_weight_bytes, load_spec, make_plan
from officellm.engine.loading.model_loader import bundled_model_path
from officellm.engine.worker.worker import CPU_KV_CAP, CPU_KV_FRACTION

# Bytes per weight for --dtype auto: the CPU may choose float32 (an upper bound; it picks
# bf16 only where that measures faster), CUDA a 16-bit type.
AUTO_DTYPE_BYTES = {"cpu": 4, "cuda": 2}
DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class ModelFootprint:
    """A model's memory: its weights as held (dense in its dtype, or a GGUF's blocks), its KV
    pool, and the host RAM its KV tiers below the pool take (tier_ram_bytes)."""

    weight_bytes: int
    kv_cache_bytes: int
    tier_ram_bytes: int = 0
    # Whether the weights and pool are in RAM too (the CPU): the tiers' RAM is then in the
    # same budget; on a GPU the budget is the device's and the tiers' RAM is the host's.
    pool_in_ram: bool = True

    @property
    def total_bytes(self) -> int:
        """What counts against the memory budget."""
        tiers = self.tier_ram_bytes if self.pool_in_ram else 0
        return self.weight_bytes + self.kv_cache_bytes + tiers


def tier_ram_bytes(config: EngineConfig, kv_cache_bytes: int,
                   host_bytes: int | None = None) -> int:
    """The RAM the config's KV tiers below a pool of this size take at most: the host tier
    (`host_bytes` as allocated, where known: `auto` sizes it from the RAM free at load), and
    the disk tier's queued writes and reader buffers."""
    disk = disk_tier_memory_bytes(kv_cache_bytes) if config.kv_disk_dir is not None else 0
    return (host_tier_bytes(config) if host_bytes is None else host_bytes) + disk


def default_cpu_kv_bytes() -> int:
    """The KV pool a CPU engine takes without --kv-cache-memory (engine/worker/worker.py)."""
    return int(min(available_memory_bytes() * CPU_KV_FRACTION, CPU_KV_CAP))


def estimate_footprint(config: EngineConfig, kv_cache_bytes: int | None = None) -> ModelFootprint:
    """The planned footprint of `config`'s model: weights by the parameter count in its
    dtype, or for a .gguf on the CPU its blocks as the file holds them (kv_plan's
    gguf_weight_bytes: --quantization auto's dense copy for large batches, where it keeps
    one, is counted once the model has loaded and says what it holds); the KV pool
    `kv_cache_bytes`, else config.kv_cache_memory, else the CPU default (on CUDA:
    ValueError, saying to give one); and its KV tiers' RAM. Reads only the model's config."""
    source = bundled_model_path() if config.model is None else Path(config.model).expanduser()
    spec, name = load_spec(str(source))
    device = config.device.split(":")[0]
    if config.dtype == "auto":
        dtype = "fp32" if AUTO_DTYPE_BYTES.get(device, 4) == 4 else "bf16"
    else:
        dtype = DTYPE_NAMES[config.dtype.lower()]
    held = (gguf_weight_bytes(str(source), dtype, device, config.tensor_parallel_size)
            if config.quantization in ("auto", "gguf") else None)
    plan = make_plan(spec, name, 0, dtype, tensor_parallel_size=config.tensor_parallel_size,
                     held_weight_bytes=held)
    weights = plan.weight_bytes * config.tensor_parallel_size
    kv = kv_cache_bytes if kv_cache_bytes is not None else config.kv_cache_memory
    if kv is None and device == "cuda":
        # On a GPU an engine without --kv-cache-memory takes --gpu-memory-utilization of the
        # whole device, which leaves nothing to plan a second model in.
        raise ValueError(f"The KV pool of {name} on a GPU cannot be planned beside other "
                         "models without a size: give it a kv_cache_memory (e.g. `officellm "
                         "models add ... --kv-cache-memory 8GiB`).")
    if kv is None:
        kv = default_cpu_kv_bytes()
    return ModelFootprint(weights, int(kv) * config.tensor_parallel_size,
                          tier_ram_bytes(config, int(kv)), device != "cuda")


# Of the RAM available when the server starts, the share its models may take together; the
# rest stays the desk's (the office's other programs, the page cache).
CPU_BUDGET_FRACTION = 0.8


def default_memory_budget(config: EngineConfig) -> int:
    """What the models together may take when no --memory-budget is given: on CUDA the
    --gpu-memory-utilization share of the device, else CPU_BUDGET_FRACTION of the RAM
    available now."""
    if config.device.startswith("cuda"):
        import torch

        _, total = torch.cuda.mem_get_info(torch.device(config.device))
        return int(total * config.gpu_memory_utilization)
    return int(available_memory_bytes() * CPU_BUDGET_FRACTION)
