"""Engine configuration in one typed place."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from officellm.engine.core.scheduling_policy import SCHEDULING_POLICIES
from officellm.engine.core.speculative_config import SpeculativeConfig
from officellm.engine.precision.kv_cache_dtype import check_kv_cache_dtype
from officellm.engine.precision.weight_quantization import check_quantization

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


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: str | int | float) -> float:
    """Seconds from 90, 90s, 30m, 12h or 7d."""
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = value.strip().lower()
        unit = _DURATION_UNITS.get(text[-1:]) if text else None
        try:
            seconds = float(text[:-1] if unit else text) * (unit or 1)
        except ValueError:
            raise ValueError(f"not a duration: {value!r} (e.g. 3600, 30m, 12h, 7d)") from None
    if seconds <= 0:
        raise ValueError(f"a duration must be positive, got {value!r}")
    return seconds


# kv_disk_dir's "the server's data directory" (resolved by officellm serve).
KV_DISK_AUTO = "auto"
# kv_offloading_size's "by device" (resolved by the engine as it starts: host_tier_bytes).
KV_OFFLOADING_AUTO = "auto"


def parse_offloading_size(value: str | int | float | None) -> int | str | None:
    """kv_offloading_size in bytes: text of a plain number is GiB (vLLM's flag: 8), or a
    size with its unit (8GiB); a number (not text) is bytes, as every size in EngineConfig;
    auto stays auto; 0, off or none is None."""
    if value is None or value == KV_OFFLOADING_AUTO:
        return value
    if isinstance(value, str) and value.strip().lower() in ("", "0", "off", "none"):
        return None
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]*\.?[0-9]+\s*", value):
        size = int(float(value) * 1024**3)
    else:
        size = parse_memory(value)
    if size < 0:
        raise ValueError(f"kv_offloading_size must not be negative, got {value!r}")
    return size or None

# Why the KV cache's lower tiers run on one rank only (the config's refusal, and the
# tensor-parallel executor's).
LOWER_TIER_NEEDS_ONE_RANK = ("the KV cache's host and disk tiers need tensor_parallel_size "
                             "1: each rank would keep its own shard of every block")


def knob(default: Any, help: str, parse: Callable[[str], Any] | None = None,
         alias: str | None = None) -> Any:
    """An EngineConfig field that is also a command-line flag: `help` is its one sentence,
    `parse` reads its value (None: a boolean switch, --x/--no-x), `alias` a short flag."""
    return field(default=default, metadata={"help": help, "parse": parse, "alias": alias})


@dataclass
class EngineConfig:
    """Everything the engine needs to start, declared once: `LLM(**kwargs)` takes these
    names, `officellm serve` makes a flag of each knob (vLLM's flag names), and the server's
    settings hold one EngineConfig."""

    model: str | None = None  # HF directory, .gguf file; None = the bundled SmolLM2 (serve's argument)
    device: str = knob("cpu", "cpu | cuda", str)
    dtype: str = knob("auto", "auto | float32 | bfloat16 | float16", str)
    kv_cache_dtype: str = knob(
        "auto", "auto | float32 | bfloat16 | float16 | fp8_e4m3 | fp8_e5m2 | int8: the KV cache's "
                "dtype (auto: the model's, but bfloat16 under a float32 model on the CPU: half "
                "the bytes per token; fp8 and int8 (a scale per row) about halve a 16-bit "
                "cache's, on every backend)", str)
    quantization: str = knob(
        "auto", "auto | gguf | int8 | int4 | none: matmul weights kept in low-bit blocks "
                "on the CPU (gguf: a GGUF's own Q8_0/Q4_0/Q4_1/Q4_K/Q6_K; int8/int4: a "
                "safetensors model's, quantized at load; none: dequantized; auto: gguf where "
                "it measures faster than dense at load, else none)", str, alias="-q")
    max_model_len: int | None = knob(None, "longest request (prompt plus output) in tokens; "
                                           "default: the model's, as far as the KV pool allows", int)
    block_size: int = knob(16, "tokens per KV block (a power of two)", int)
    max_num_seqs: int = knob(256, "most sequences running at once", int)
    max_num_batched_tokens: int = knob(2048, "token budget per step (chunked prefill)", int)
    enable_prefix_caching: bool = knob(True, "reuse the KV of prompts' shared prefixes")
    kv_cache_memory: int | str | None = knob(
        None, "KV pool size, e.g. 4GiB (the CPU's; on CUDA it overrides profiling); under "
              "tensor parallelism, per rank", str)
    gpu_memory_utilization: float = knob(0.9, "share of GPU memory the engine may use", float)
    seed: int = knob(0, "seed of unseeded requests' sampling", int)
    tensor_parallel_size: int = knob(1, "split the model over this many GPUs (or CPU "
                                        "processes)", int, alias="-tp")
    num_threads: int | None = knob(None, "CPU threads for matmuls; default: $OMP_NUM_THREADS, "
                                         "else the cores shared among the ranks", int)
    attention_backend: str | None = knob(None, "torch | cpu | triton; default: by device", str)
    enforce_eager: bool = knob(False, "CUDA: no decode CUDA graphs")
    batch_invariant: bool = knob(
        False, "the same request gives bit-identical output whatever else is in its batch, "
               "whether its prompt hit the prefix cache, how its prefill was chunked and "
               "whether speculation ran: every matmul and attention row in one fixed order "
               "(docs/batch_invariance.md; costs prefill speed)")
    async_scheduling: bool | None = knob(
        None, "schedule and launch each step while the device still runs the one before "
              "(its decodes read the tokens it sampled on the device): the GPU never waits "
              "for the host's scheduling; default: on for one CUDA GPU without speculation "
              "(a CPU runs the forward on the scheduling thread, so gains nothing)")
    kv_offloading_size: int | str | None = knob(
        None, "host RAM for the KV cache's tier below a GPU's pool, in GiB (vLLM's flag) or "
              "with a unit (8GiB): full blocks of the prefix cache are also copied there, and "
              "a prompt or a preempted sequence whose blocks left the pool is copied back "
              "instead of computed (docs/kv_tiers.md); auto (every profile of officellm "
              "serve): a quarter of the free RAM up to 16 GiB on CUDA, none on the CPU, whose "
              "pool is that RAM; off: none", parse_offloading_size)
    kv_disk_dir: str | None = knob(
        None, "a directory for the KV cache's disk tier: full blocks of the prefix cache are "
              "also written there, sealed, and a prompt whose prefix is there is read back "
              "instead of computed, after a restart, an idle sleep or a reload too "
              "(docs/kv_tiers.md); off: none; auto (officellm serve's office and personal "
              "profiles): kv-cache/ in the server's data directory", str)
    kv_disk_size: int | str = knob("20GiB", "the disk tier's budget, e.g. 20GiB: the least "
                                            "recently used blocks go first", str)
    kv_disk_ttl: float | str = knob("7d", "how long a block unused stays in the disk tier, "
                                          "e.g. 12h or 7d", str)
    # The disk tier's secret (at least 16 bytes): the server derives it from its install
    # key; an LLM user passes their own. Never a flag: a secret on a command line is seen by
    # every process on the machine.
    kv_disk_key: bytes | None = None
    stats_log_interval: float = 5.0  # seconds between periodic stats lines while busy
    # While decodes run, size prefill chunks so a step costs about this many decode-only
    # steps (engine/core/prefill_pacer.py); None = the token budget alone decides.
    prefill_pacing: float | None = knob(
        None, "while others are typing, a prompt's chunk is sized so a step costs about X "
              "decode-only steps (0: off)", float)
    # engine/core/scheduling_policy.py; fcfs by default, so the offline LLM schedules as
    # vLLM does. The server's office and product profiles choose fair.
    scheduling_policy: str = knob(
        "fcfs", "fcfs | priority | fair: arrival order; by request priority; or shares between "
                "fairness keys (the server's users)", str)

    # N-gram speculation (vLLM's flag): drafts from the sequence's own prompt and output,
    # verified in the batch's forward pass (engine/core/ngram_proposer.py); None: off.
    speculative_config: SpeculativeConfig | None = knob(
        None, 'JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4, '
              '"prompt_lookup_min": 2, "prompt_lookup_max": 4}\': draft tokens by looking '
              "the sequence's latest words up in its own prompt and output, and verify them "
              "in one forward pass (requests without a grammar; sampled ones by rejection "
              "sampling; each pauses drafting while its drafts are mostly rejected)", SpeculativeConfig.parse)

    def __post_init__(self) -> None:
        if self.speculative_config is not None:
            self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        if self.prefill_pacing == 0:  # the flag's "off"
            self.prefill_pacing = None
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
        check_kv_cache_dtype(self.kv_cache_dtype)
        check_quantization(self.quantization)
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                             f"not {self.scheduling_policy!r}.")
        if self.tensor_parallel_size < 1:
            raise ValueError("tensor_parallel_size must be at least 1.")
        if self.tensor_parallel_size > 1 and ":" in self.device:
            raise ValueError(f"With tensor_parallel_size > 1 give the device without an index "
                             f"(rank r uses cuda:r), not {self.device!r}.")
        if self.batch_invariant and self.tensor_parallel_size > 2:
            # Two ranks' partial sums add the same in either order; a ring all-reduce over
            # more adds each element in an order that follows the tensor's size (the batch).
            raise ValueError("batch_invariant holds for tensor_parallel_size 1 or 2, not "
                             f"{self.tensor_parallel_size}: a ring all-reduce over more ranks "
                             "sums in an order that follows the batch's size.")
        if self.async_scheduling and self.tensor_parallel_size > 1:
            raise ValueError("async_scheduling needs tensor_parallel_size 1: the other ranks "
                             "cannot read the tokens rank 0 sampled on its device.")
        if self.async_scheduling and self.speculative_config is not None:
            raise ValueError("async_scheduling and speculative_config do not combine: a "
                             "draft follows the last token, which must be read first.")
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_memory(self.kv_cache_memory)
        self.kv_offloading_size = parse_offloading_size(self.kv_offloading_size)
        if self.kv_offloading_size == KV_OFFLOADING_AUTO and (self.tensor_parallel_size > 1
                                                              or not self.enable_prefix_caching):
            self.kv_offloading_size = None  # the server's default, where it cannot apply
        if self.kv_offloading_size is not None:
            if self.tensor_parallel_size > 1:
                raise ValueError(LOWER_TIER_NEEDS_ONE_RANK + ".")
            if not self.enable_prefix_caching:
                raise ValueError("the KV host tier keeps the prefix cache's blocks: it needs "
                                 "enable_prefix_caching.")
        if self.kv_disk_dir in ("", "off", "none"):
            self.kv_disk_dir = None
        self.kv_disk_size = parse_memory(self.kv_disk_size)
        self.kv_disk_ttl = parse_duration(self.kv_disk_ttl)
        if self.kv_disk_dir == KV_DISK_AUTO and (self.tensor_parallel_size > 1
                                                 or not self.enable_prefix_caching):
            self.kv_disk_dir = None  # the server's default, where it cannot apply
        if self.kv_disk_dir is not None:
            if self.tensor_parallel_size > 1:
                raise ValueError(LOWER_TIER_NEEDS_ONE_RANK + ".")
            if not self.enable_prefix_caching:
                raise ValueError("the KV disk tier keeps the prefix cache's blocks: it needs "
                                 "enable_prefix_caching.")


def engine_knobs() -> list[Any]:
    """The EngineConfig fields that are command-line flags (dataclasses.Field objects)."""
    return [f for f in fields(EngineConfig) if "help" in f.metadata]
