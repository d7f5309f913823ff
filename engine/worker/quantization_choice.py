"""`--quantization auto` on the CPU: blocks or dense weights, by batch size, as this machine
runs them.

The layers' matmuls are timed at load, dense and in blocks, at each batch of MEASURED_ROWS
rows: as many layers as it takes for their dense weights to outgrow twice the last-level
cache, so that each reads its weights from memory as a decode step does (one matmul timed
alone over and over runs from the cache, where dense float32 looks faster than it is). Few
rows (a lone user typing) are bound by the bytes read, where blocks win; an office batch by
arithmetic, where an AVX-512-BF16 CPU's packed bf16 matmul beats the integer kernel and an
AVX2 CPU's float32 one about ties with it. Blocks clearly slower at no size: blocks for
every batch, the dense weights released (`gguf`). Clearly faster up to some size only: both
kept, blocks for batches up to that size. Never clearly faster: `none`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from officellm.engine.loading.gguf_tensors import QuantizedTensor
from officellm.engine.models import packed_linear
from officellm.engine.models.decoder import DecoderModel
from officellm.engine.models.quantized_linear import QuantizedWeight
from officellm.engine.precision.measured_choice import machine_key, remembered
from officellm.kernels.reference import quant_reference

logger = logging.getLogger("officellm.engine.quantization_choice")


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


def rows_in_words(n: int) -> str:
    """'1 row', '16 rows': batch sizes in the start-up log."""
    return f"{n} row{'s' if n != 1 else ''}"


# blocks_reach's answers, kept in the cache directory (engine/precision/measured_choice.py) by model
# file, dtype, packing and machine.
CHOICES_FILE = "quantization_choices.json"


def _choice_key(source: str, dtype: torch.dtype, packs: bool) -> str:
    path = Path(source)
    stamp = f"{path.stat().st_size}:{path.stat().st_mtime_ns}" if path.exists() else "-"
    return "|".join([str(path.resolve()), stamp, str(dtype), str(packs), *machine_key()])


def remembered_reach(source: str, dtype: torch.dtype, packs: bool,
                     measure: Callable[[], int | None],
                     cache_dir: Path | None = None) -> int | None:
    """blocks_reach for `source` as first measured on this machine (`measure` runs once;
    the answer is kept in `cache_dir`, default the engine's cache directory)."""
    reach, kept_in = remembered(CHOICES_FILE, _choice_key(source, dtype, packs), measure,
                                cache_dir)
    if kept_in is not None:
        logger.info("quantization auto: the choice measured at this model's first start on "
                    "this machine (%s; delete %s to measure again)",
                    "every batch" if reach is None else rows_in_words(reach), kept_in)
    return reach


def blocks_reach(model: DecoderModel, blocks: dict[str, QuantizedTensor], matmul, pack,
                 packs: bool, dtype: torch.dtype) -> int | None:
    """The largest batch to run over blocks (None: every batch; 0: none), from the layers'
    matmuls timed dense (as they would run; `packs`: packed for oneDNN) and over blocks (in
    the kernel's layout); logged with the timings."""
    pairs = measured_pairs(_matmul_pairs(model, blocks, matmul, pack, packs))
    if not pairs:
        return None  # no layer's matmul to compare: the file's own blocks (head, table)
    timings = time_matmuls(pairs, dtype)
    max_rows = blocks_max_rows(timings)
    choice = ("gguf" if max_rows is None else "none" if max_rows == 0
              else f"gguf up to {rows_in_words(max_rows)}, none above")
    logger.info("quantization auto -> %s: the layers' matmuls measured here from memory, "
                "GGUF blocks vs dense (%s%s): %s", choice, str(dtype).removeprefix("torch."),
                ", packed for oneDNN" if packs else "",
                "; ".join(f"{rows_in_words(t.rows)} {t.blocks_ms:.2f} vs {t.dense_ms:.2f} ms"
                          for t in timings))
    return max_rows


def dense_copy_bytes(model: DecoderModel, blocks: dict[str, QuantizedTensor]) -> int:
    """The bytes of the dense weights that blocks could serve instead (the layers' matmuls
    whose parts are all in `blocks`, the head, the embedding table), as the model holds them:
    what keeping both costs over blocks alone."""
    total = 0
    for module, names in model.layer_matmuls():
        if all(n in blocks for n in names):
            total += module.weight.numel() * module.weight.element_size()
    table = model.embed.weight
    if "model.embed_tokens.weight" in blocks:
        total += table.numel() * table.element_size()
    head = model.lm_head.weight
    if head is not None and "lm_head.weight" in blocks:
        total += head.numel() * head.element_size()
    return total


def _matmul_pairs(model: DecoderModel, blocks: dict[str, QuantizedTensor], matmul, pack,
                  packs: bool) -> Iterator[MatmulPair]:
    """Each layer's matmuls whose weights are all in `blocks`, in layer order: the dense
    side dequantized from the blocks here (as loading would), so that the choice is made
    before the model loads, and a dense copy is only ever loaded where it is kept."""
    for module, names in model.layer_matmuls():
        found = [blocks.get(n) for n in names]
        if all(t is not None for t in found):
            weight = torch.cat([quant_reference.dequantize(t.data, t.fmt)  # type: ignore[union-attr]
                                for t in found]).to(module.weight.dtype)
            packed = packed_linear.pack(weight) if packs else None
            yield MatmulPair(
                weight.shape[1],
                lambda x, w=weight, p=packed: packed_linear.linear(x, w, None, p),
                QuantizedWeight.fuse(found, matmul, pack=pack),
                weight.numel() * weight.element_size())
