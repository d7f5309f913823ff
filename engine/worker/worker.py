"""One rank's share of the engine: its model shard, its KV budget, its ModelRunner.

The engine process (rank 0) and every tensor-parallel worker process run the same start-up
through this class, in step, since loading, profiling, sizing and graph capture involve
collectives: build and load the shard, measure the KV budget, agree on one pool size, then
allocate the KV cache.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from officellm.engine.attention import selection
from officellm.engine.config import EngineConfig, format_gib
from officellm.engine.distributed.parallel_state import ParallelState
from officellm.engine.host_memory import available_memory_bytes
from officellm.engine.kv_plan import KVCacheTooSmallError, kv_block_bytes, size_pool
from officellm.engine.loading.gguf_tensors import GgufWeights, QuantizedTensor
from officellm.engine.loading.model_loader import gguf_source, iter_weights, load_config_dict
from officellm.engine.loading.model_spec import ModelSpec
from officellm.engine.models import packed_linear
from officellm.engine.models.decoder import DecoderModel
from officellm.engine.models.fixed_order_linear import FixedOrderWeight
from officellm.engine.models.vision import VisionTower, load_vision_tower
from officellm.engine.multimodal.processor import vision_model_type
from officellm.engine.precision.dtype_choice import resolve_dtype
from officellm.engine.precision.kv_cache_dtype import resolve_kv_cache_dtype, scale_bytes
from officellm.engine.precision.weight_quantization import (
    expert_holding,
    gguf_blocks,
    quantize_at_load,
    resolve_quantization,
)
from officellm.engine.worker.model_runner import ModelRunner, kv_cache_groups
from officellm.engine.worker.quantization_choice import (
    blocks_reach,
    dense_copy_bytes,
    remembered_reach,
    rows_in_words,
)
from officellm.kernels.cpu_features import cpu_features
from officellm.kernels.reference import quant_reference

logger = logging.getLogger("engine")

# Default CPU KV pool when --kv-cache-memory is not given: this share of available RAM,
# capped, so that a desk machine keeps room for everything else it runs.
CPU_KV_FRACTION = 0.2
CPU_KV_CAP = 8 * 1024**3
# `--quantization auto` keeps a dense copy of a GGUF's matmuls for large batches only where
# it takes at most this share of the memory available after the blocks are read: the rest
# is the KV pool's and everything else the machine runs. An 8B model's bf16 copy (14 GiB)
# beside its blocks was killed for memory at load on a 23 GiB desktop.
DENSE_COPY_FRACTION = 0.5


@dataclass(frozen=True)
class WeightsHeld:
    """How a worker holds its weights, in words for the log and the console, and the
    Hugging Face names of the weights it does not load (blocks serve every batch)."""

    words: str
    released: frozenset[str]


def cpu_threads(requested: int | None, world_size: int = 1) -> int:
    """Threads for CPU matmuls: as asked, else OMP_NUM_THREADS when set, else the cores
    shared out among the tensor-parallel ranks (which all run on this machine)."""
    if requested:
        return requested
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, (os.cpu_count() or 1) // world_size)


def rank_device(device: str, rank: int) -> torch.device:
    """Rank r uses GPU r; the CPU is shared."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", rank)
    return dev


def check_devices(device: str, world_size: int) -> None:
    """Refuse, before any worker starts, a tensor-parallel size this machine cannot run."""
    if torch.device(device).type == "cuda" and world_size > torch.cuda.device_count():
        raise ValueError(f"--tensor-parallel-size {world_size} needs {world_size} GPUs; this "
                         f"machine has {torch.cuda.device_count()}.")


class Worker:
    """Builds this rank's model shard and, once the pool is sized, its ModelRunner."""

    def __init__(self, config: EngineConfig, model_dir: Path, parallel: ParallelState) -> None:
        t0 = time.monotonic()
        self.config = config
        self.parallel = parallel
        self.device = rank_device(config.device, parallel.rank)
        if self.device.type == "cpu":
            torch.set_num_threads(cpu_threads(config.num_threads, parallel.world_size))
        elif self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.spec = ModelSpec.from_config_dict(load_config_dict(model_dir))
        self.dtype = resolve_dtype(config.dtype, self.device, self.spec.torch_dtype,
                                   self.spec.hidden_size, self.spec.intermediate_size)
        self.backend = selection.backend_for(self.device, config.attention_backend)
        source = gguf_source(model_dir)
        self.matmul_dtype = self.dtype
        split = self._float32_between_blocks(source)
        if split:
            # Between matmuls that read a GGUF's blocks, activations stay float32, as
            # llama.cpp keeps them: rounding each one to bf16 made the bundled model's KL
            # divergence from its float32 self 1.3x llama.cpp's (benchmarks/fidelity.py).
            # Large batches still run bf16 dense weights where auto keeps them.
            self.dtype = torch.float32
            logger.info("Activations float32 between the GGUF's matmuls, dense weights "
                        "(for large batches) %s, KV cache float16 unless --kv-cache-dtype "
                        "says otherwise", str(self.matmul_dtype).removeprefix("torch."))
        if config.batch_invariant:
            selection.check_batch_invariant(self.backend)
            if self.backend == "cpu" and self.dtype not in (torch.float32, torch.bfloat16):
                raise ValueError(f"--batch-invariant on the CPU runs float32 or bfloat16 "
                                 f"matmuls, not {self.dtype}: use --dtype float32, bfloat16 "
                                 f"or auto.")
        # With float32 between a GGUF's matmuls, auto's KV cache is float16 (llama.cpp's
        # default for the same file): 3 more mantissa bits than bf16 in the same bytes took
        # the bundled model's KL divergence from 1.02x llama.cpp's to 0.97x.
        kv_requested = ("float16" if split and config.kv_cache_dtype == "auto"
                        else config.kv_cache_dtype)
        self.kv_dtype = resolve_kv_cache_dtype(
            kv_requested, self.dtype, self.backend,
            torch.cuda.get_device_capability(self.device) if self.device.type == "cuda" else None)
        self.model = DecoderModel(self.spec, self.dtype,
                                  selection.ops_for(self.device, self.backend), parallel,
                                  self.matmul_dtype)
        self.model.to(self.device)
        # A GGUF's blocks, read once: a mixture's experts are held before the dense weights
        # load (they are not in the dense copy), and so are the matmuls' blocks, so that
        # what only blocks serve is neither read nor dequantized.
        gguf = (gguf_blocks(source, self.spec.num_heads, self.spec.num_kv_heads)
                if source is not None else None)
        holding = expert_holding(config.quantization, self.backend, parallel.world_size,
                                 self.model.ops.moe_pack)
        moe_kept = self.model.hold_experts(gguf.experts, holding) if gguf is not None else 0
        packs = (self.backend == "cpu" and self.matmul_dtype == torch.bfloat16
                 and packed_linear.can_pack(self.device, self.matmul_dtype)
                 and not config.batch_invariant)
        kept = self._keep_quantized(model_dir, source, gguf, packs)
        self.vision = self._vision_tower(model_dir)
        self.model.load_weights(iter_weights(model_dir, skip=kept.released), holding,
                                self.vision)
        moe_kept += sum(1 for layer in self.model.layers
                        if layer.moe is not None and layer.moe.quantized is not None
                        and gguf is None)
        self.weight_format = kept.words + (f", {moe_kept} MoE layers' experts in blocks"
                                           if moe_kept else "")
        self.weight_bytes = self.model.weight_bytes()
        if isinstance(self.vision, torch.nn.Module):
            self.weight_bytes += sum(p.numel() * p.element_size()
                                     for p in self.vision.parameters())
        if config.batch_invariant:
            ops = self.model.ops
            assert ops.fixed_order_pack is not None and ops.fixed_order_matmul is not None
            dense = self.model.pack_linears(lambda w: FixedOrderWeight.of(
                w, ops.fixed_order_pack, ops.fixed_order_matmul))
            logger.info("Batch-invariant: every attention row through the decode kernel, %d "
                        "dense matmuls in fixed order, weights %s (docs/batch_invariance.md)",
                        dense, self.weight_format)
        elif self.backend == "cpu" and self.matmul_dtype == torch.bfloat16:
            features = cpu_features()
            if packs:
                self.model.pack_linears()
            elif packed_linear.torch_can_pack():
                logger.info("bf16 weights are not pre-packed for oneDNN: this CPU (%s) has "
                            "neither AVX-512 BW/VL/DQ nor AVX-NE-CONVERT",
                            features.describe())
        self.load_seconds = time.monotonic() - t0
        self.runner: ModelRunner | None = None

    def _vision_tower(self, model_dir: Path) -> VisionTower | None:
        """The model's vision tower when the engine serves its images (a vision checkpoint
        with its image processor, on one rank), else None (its language model alone)."""
        if vision_model_type(model_dir) is None:
            return None
        if self.parallel.world_size > 1:
            logger.warning("Images are not served under tensor parallelism: the vision tower "
                           "runs on one rank only; this model answers text alone.")
            return None
        if self.config.batch_invariant:
            # Its row kernels are causal, and an image's tokens may attend both ways.
            logger.warning("Images are not served with --batch-invariant: this model "
                           "answers text alone.")
            return None
        tower = load_vision_tower(load_config_dict(model_dir), self.dtype, self.device)
        if tower is not None and self.config.max_num_batched_tokens < tower.max_tokens_per_image:
            raise ValueError(
                f"max_num_batched_tokens ({self.config.max_num_batched_tokens}) must hold one "
                f"image's {tower.max_tokens_per_image} tokens: an image is never split across "
                "steps.")
        return tower

    def _float32_between_blocks(self, source: Path | None) -> bool:
        """--dtype auto chose bf16 for a GGUF whose matmuls read blocks on this CPU: then
        the activations are float32 and only the dense weights bf16 (and packed)."""
        cfg = self.config
        return (cfg.dtype == "auto" and source is not None and self.backend == "cpu"
                and self.dtype == torch.bfloat16 and not cfg.batch_invariant
                and packed_linear.can_pack(self.device, torch.bfloat16)
                and resolve_quantization(cfg.quantization, source, self.backend,
                                         self.parallel.world_size) == "gguf")

    def _keep_quantized(self, model_dir: Path, source: Path | None, gguf: GgufWeights | None,
                        packs: bool) -> WeightsHeld:
        """Put the matmuls that `--quantization` keeps in blocks on them, before the model
        loads. `source`/`gguf`: the GGUF the model came from and its blocks; `packs`: the
        dense weights would be packed for oneDNN (what auto measures against)."""
        method = resolve_quantization(self.config.quantization, source, self.backend,
                                      self.parallel.world_size)
        if method == "none":
            return WeightsHeld("dense", frozenset())
        if method == "gguf":
            assert gguf is not None
            blocks = gguf.tensors
        else:
            blocks = quantize_at_load(iter_weights(model_dir), method)
        matmul, pack = self.model.ops.quant_matmul, self.model.ops.quant_pack
        # Batch-invariant: one kernel for every batch size, so the blocks for all of them.
        max_rows = (self._auto_reach(source or model_dir, blocks, packs)
                    if self.config.quantization == "auto" and not self.config.batch_invariant
                    else None)
        if max_rows == 0:
            return WeightsHeld("dense", frozenset())
        kept = self.model.keep_quantized(blocks, matmul, max_rows, pack)
        formats = ", ".join(sorted({quant_reference.NAMES.get(b.fmt, str(b.fmt))
                                    for b in blocks.values()}))
        reach = rows_in_words(max_rows) if max_rows is not None else ""
        logger.info("Weights kept quantized (%s): %d matmuls read GGUF blocks (%s)%s", method,
                    kept.modules, formats, "" if max_rows is None else
                    f" for batches of up to {reach}, their dense weights for larger")
        return WeightsHeld(f"in blocks ({method})" if max_rows is None else
                           f"dense, and in blocks ({method}) up to {reach}", kept.released)

    def _auto_reach(self, source: Path, blocks: dict[str, QuantizedTensor], packs: bool
                    ) -> int | None:
        """`--quantization auto`'s largest batch over blocks (None: every batch; 0: none):
        as measured at this model's first start on this machine, unless the dense copy it
        would keep for larger batches does not fit in DENSE_COPY_FRACTION of the memory
        available now (then blocks for every batch, without measuring)."""
        dense = dense_copy_bytes(self.model, blocks)
        room = available_memory_bytes()
        if dense > DENSE_COPY_FRACTION * room:
            logger.info("quantization auto -> gguf for every batch: a dense copy of the "
                        "matmuls for large batches would take %s, more than %d%% of the %s "
                        "of memory available", format_gib(dense),
                        round(100 * DENSE_COPY_FRACTION), format_gib(room))
            return None
        matmul, pack = self.model.ops.quant_matmul, self.model.ops.quant_pack
        return remembered_reach(str(source), self.matmul_dtype, packs,
                                lambda: blocks_reach(self.model, blocks, matmul, pack, packs,
                                                     self.dtype))

    def kv_budget(self) -> tuple[int, str]:
        """Bytes this rank can give its KV pool, and the flag that sets it."""
        cfg = self.config
        if cfg.kv_cache_memory is not None:
            return int(cfg.kv_cache_memory), "--kv-cache-memory"
        if self.device.type == "cuda":
            from officellm.engine.worker.memory_profiling import profile_cuda

            profile = profile_cuda(self.model, self.spec, self.dtype, self.device,
                                   self.weight_bytes, cfg.gpu_memory_utilization,
                                   cfg.max_num_batched_tokens, cfg.max_num_seqs,
                                   cfg.block_size, self.graph_batch(), self.backend)
            return profile.kv_budget, "--gpu-memory-utilization"
        # The ranks of a CPU engine share this machine's memory.
        share = min(available_memory_bytes() * CPU_KV_FRACTION, CPU_KV_CAP)
        return int(share / self.parallel.world_size), "--kv-cache-memory"

    def graph_batch(self) -> int:
        """The largest decode batch captured in CUDA graphs; 0 when none are (CPU, torch
        backend, whose decode shapes vary with context length, --enforce-eager, or tensor
        parallelism, whose collectives are not captured)."""
        cfg = self.config
        if (self.device.type != "cuda" or self.backend != "triton" or cfg.enforce_eager
                or self.parallel.world_size > 1):
            return 0
        from officellm.engine.worker.cuda_graphs import capture_sizes

        return capture_sizes(cfg.max_num_seqs)[-1]

    def size_pool(self) -> tuple[int, int]:
        """(num_blocks, max_model_len), the same on every rank.

        Each rank measures its own budget; rank 0 sizes the pool from the smallest, logs the
        numbers (docs/design.md §3's lines, plus each rank's budget under tensor parallelism) and
        tells the others, or raises KVCacheTooSmallError on every rank.
        """
        budget, flag = self.kv_budget()
        budgets = self.parallel.all_gather_int(budget)
        decision: tuple[int, int] | KVCacheTooSmallError | None = None
        if self.parallel.is_first:
            tp = self.parallel.world_size
            if tp > 1:
                for rank, b in enumerate(budgets):
                    logger.info("Rank %d: available KV cache memory: %s", rank, format_gib(b))
                logger.info("KV cache pool per rank: the minimum over %d ranks, %s", tp,
                            format_gib(min(budgets)))
            groups = kv_cache_groups(self.spec)
            block = kv_block_bytes(self.spec, groups, self.kv_dtype.itemsize,
                                   scale_bytes(self.kv_dtype), self.config.block_size, tp)
            try:
                decision = size_pool(self.spec, min(budgets), block, self.config.block_size,
                                     self.config.max_model_len, flag, groups,
                                     self.config.max_num_batched_tokens)
            except KVCacheTooSmallError as exc:
                decision = exc
        decision = self.parallel.broadcast_object(decision)
        if isinstance(decision, KVCacheTooSmallError):
            raise decision
        assert decision is not None
        return decision

    def init_cache(self, num_blocks: int, max_model_len: int) -> ModelRunner:
        """Allocate this rank's KV pool and runner (and capture decode graphs on CUDA)."""
        cfg = self.config
        self.model.init_rotary(max_model_len + 1)
        self.runner = ModelRunner(self.model, self.spec, num_blocks, cfg.block_size, self.kv_dtype,
                                  self.device, cfg.seed, self.backend, cfg.batch_invariant,
                                  self.vision)
        if self.graph_batch():
            self.runner.capture_decode_graphs(cfg.max_num_seqs, max_model_len)
        return self.runner
