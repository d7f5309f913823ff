"""Which matmul weights stay in low-bit blocks (`--quantization`, vLLM's flag name).

- `gguf`: a GGUF's Q8_0, Q4_0, Q4_1, Q4_K and Q6_K tensors run in their blocks
  (kernels/cpu/quant_matmul.cpp); a tensor of another type is dequantized, with one WARNING
  naming the type.
- `int8` / `int4`: a safetensors model's matmul weights are quantized at load, per 32
  weights (int8: Q8_0, a scale per group; int4: Q4_1, a scale and an offset per group).
- `none`: every weight dequantized to the model dtype (what transformers computes with).
- `auto`: for a GGUF on the CPU, the layers' matmuls are timed at load, dense and in
  blocks, at each batch of MEASURED_ROWS rows: as many layers as it takes for their dense
  weights to outgrow twice the last-level cache, so that each reads its weights from memory
  as a decode step does (one matmul timed alone over and over runs from the cache, where
  dense float32 looks faster than it is). Few rows (a lone user typing) are bound by the
  bytes read, where blocks win; an office batch by arithmetic, where an AVX-512-BF16 CPU's
  packed bf16 matmul beats the integer kernel and an AVX2 CPU's float32 one about ties with
  it. Blocks clearly slower at no size: blocks for every batch, the dense weights released
  (`gguf`). Clearly faster up to some size only: both kept, blocks for batches up to that
  size. Never clearly faster: `none`.

Blocks run on the CPU (the cpu and torch backends), on one rank: the Triton kernels read
dense weights, and a row-parallel shard would cut the blocks' input features.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from officellm.engine.loading.gguf_tensors import GgufWeights, QuantizedTensor, read_quantized
from officellm.kernels.reference import quant_reference

logger = logging.getLogger("officellm.engine.weight_quantization")

QUANTIZATIONS = ("auto", "gguf", "int8", "int4", "none")
_BLOCK_BACKENDS = ("cpu", "torch")
# The Hugging Face names of the weights a matmul reads (and the embedding table).
_MATMUL_SUFFIXES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                    "gate_proj.weight", "up_proj.weight", "down_proj.weight",
                    "embed_tokens.weight", "lm_head.weight")


# A lone user, a few, an office typing at once, and a prefill chunk.
MEASURED_ROWS = (1, 4, 8, 16, 64)
WIN_MARGIN = 0.9  # "clearly": 10% apart


@dataclass(frozen=True)
class MatmulTiming:
    """The layers' matmuls timed both ways at load, at one batch size."""

    rows: int
    dense_ms: float
    blocks_ms: float


@dataclass(frozen=True)
class MatmulPair:
    """One layer's matmul, dense (as it would run) and over its blocks."""

    in_features: int
    dense: Callable[[torch.Tensor], torch.Tensor]
    blocks: Callable[[torch.Tensor], torch.Tensor]
    dense_bytes: int


def last_level_cache_bytes() -> int:
    """The CPU's largest cache (Linux sysfs); 32 MiB, a desktop's, where it cannot be read."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 1024, "M": 1024**2}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KM")) * unit)
    return max(sizes, default=32 * 1024**2)


def measured_pairs(pairs: Iterable[MatmulPair]) -> list[MatmulPair]:
    """The first pairs whose dense weights outgrow twice the last-level cache (all of them
    if they never do)."""
    budget, taken = 2 * last_level_cache_bytes(), []
    for pair in pairs:
        taken.append(pair)
        budget -= pair.dense_bytes
        if budget <= 0:
            break
    return taken


def time_matmuls(pairs: list[MatmulPair], dtype: torch.dtype) -> list[MatmulTiming]:
    """At each of MEASURED_ROWS, the best of three sweeps of each way over `pairs`."""
    def best_of(fns: list[Callable[[torch.Tensor], torch.Tensor]],
                xs: list[torch.Tensor]) -> float:
        times = []
        for _ in range(4):  # the first sweep warms up, and is not counted
            t0 = time.perf_counter()
            for fn, x in zip(fns, xs, strict=True):
                fn(x)
            times.append(time.perf_counter() - t0)
        return min(times[1:]) * 1e3

    timings = []
    for rows in MEASURED_ROWS:
        inputs = {k: torch.randn(rows, k).to(dtype) for k in {p.in_features for p in pairs}}
        xs = [inputs[p.in_features] for p in pairs]
        timings.append(MatmulTiming(rows, best_of([p.dense for p in pairs], xs),
                                    best_of([p.blocks for p in pairs], xs)))
    return timings


def blocks_max_rows(timings: Iterable[MatmulTiming]) -> int | None:
    """The largest batch that runs over blocks: None for every batch (blocks clearly slower
    at no measured size), else the largest measured size up to which they are clearly
    faster at every size (0: none). A tie goes to dense weights: a coin flip between two
    equal timings would change the numbers from one start to the next."""
    timings = sorted(timings, key=lambda t: t.rows)
    if not any(t.blocks_ms < WIN_MARGIN * t.dense_ms for t in timings):
        return 0
    if not any(t.dense_ms < WIN_MARGIN * t.blocks_ms for t in timings):
        return None
    reach = 0
    for t in timings:
        if not t.blocks_ms < WIN_MARGIN * t.dense_ms:
            break
        reach = t.rows
    return reach


def check_quantization(requested: str) -> None:
    """ValueError naming the choices, for an unknown `--quantization`."""
    if requested not in QUANTIZATIONS:
        raise ValueError(f"Unknown quantization {requested!r}; use one of "
                         f"{', '.join(QUANTIZATIONS)}.")


def resolve_quantization(requested: str, gguf: Path | None, backend: str,
                         world_size: int) -> str:
    """`gguf`, `int8`, `int4` or `none` for this model (`gguf`: the GGUF file it was
    converted from, None for a safetensors model), attention backend and rank count;
    ValueError with the reason for a combination that cannot run."""
    check_quantization(requested)
    if requested == "none":
        return "none"
    runs_blocks = backend in _BLOCK_BACKENDS and world_size == 1
    if requested == "auto":
        return "gguf" if gguf is not None and runs_blocks else "none"
    if not runs_blocks:
        raise ValueError(f"--quantization {requested} runs on the CPU (cpu or torch backend) "
                         f"with one rank; this engine uses the {backend} backend with "
                         f"{world_size} rank(s): use --quantization none.")
    if requested == "gguf" and gguf is None:
        raise ValueError("--quantization gguf applies to a .gguf model; this model is "
                         "safetensors: use int8 or int4 to quantize it at load, or none.")
    if requested in ("int8", "int4") and gguf is not None:
        raise ValueError(f"--quantization {requested} quantizes a safetensors model at load; "
                         f"{gguf.name} is already quantized: use gguf (its own blocks) or none.")
    return requested


def gguf_blocks(path: Path, num_heads: int, num_kv_heads: int) -> dict[str, QuantizedTensor]:
    """The GGUF's tensors that have a kernel; one WARNING per type that has none."""
    weights: GgufWeights = read_quantized(path, num_heads, num_kv_heads)
    for type_name, names in sorted(weights.unsupported.items()):
        logger.warning("GGUF tensor type %s has no kernel here: %d tensor(s) (e.g. %s) are "
                       "dequantized, with the fused matmul they belong to", type_name,
                       len(names), names[0])
    return weights.tensors


def quantize_at_load(weights: Iterable[tuple[str, torch.Tensor]],
                     method: str) -> dict[str, QuantizedTensor]:
    """int8 (Q8_0) or int4 (Q4_1) blocks of a checkpoint's matmul weights whose input
    features are a multiple of 32 (the others stay dense)."""
    quantize = quant_reference.quantize_q8_0 if method == "int8" else quant_reference.quantize_q4_1
    fmt = quant_reference.Q8_0 if method == "int8" else quant_reference.Q4_1
    out: dict[str, QuantizedTensor] = {}
    for name, tensor in weights:
        if not name.endswith(_MATMUL_SUFFIXES):
            continue
        if not name.startswith(("model.", "lm_head")):
            name = f"model.{name}"
        if tensor.dim() == 2 and tensor.shape[1] % quant_reference.QK == 0:
            out[name] = QuantizedTensor(fmt, quantize(tensor), tensor.shape[1])
    return out
