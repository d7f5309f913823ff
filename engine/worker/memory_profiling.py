"""Start-up memory profiling on CUDA: how much memory the KV pool may take (docs/design.md §3).

    pool = total * gpu_memory_utilization - weights - peak activations - graph pools - other

`peak activations` is measured by running the model once at the largest step the scheduler
can produce (max_num_batched_tokens tokens, one sequence, with as many sampled rows as
max_num_seqs allows, plus a softmax and sort of those logits as the sampler's top-p does);
`graph pools` is the peak of one decode step at the largest captured batch, since captured
graphs keep their activation memory for good; `other` is what the GPU holds outside torch's
allocator (CUDA context, other processes).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from officellm.engine.attention import selection
from officellm.engine.attention.backend import AttentionMetadata
from officellm.engine.config import format_gib
from officellm.engine.core.kv_cache_groups import KVCacheGroups
from officellm.engine.loading.model_spec import ModelSpec

logger = logging.getLogger("officellm.engine.worker.memory_profiling")


@dataclass
class MemoryProfile:
    """What start-up profiling measured, in bytes, and the KV budget it implies."""

    total: int
    utilization: float
    weights: int
    peak_activations: int
    graph_pools: int
    other: int

    @property
    def kv_budget(self) -> int:
        return kv_budget_bytes(self.total, self.utilization, self.weights,
                               self.peak_activations, self.graph_pools, self.other)

    def log(self) -> None:
        logger.info(
            "Memory profiling: %s total x %.2f utilization - %s weights - %s peak activations "
            "- %s CUDA graphs (estimate) - %s outside torch = %s for the KV cache",
            format_gib(self.total), self.utilization, format_gib(self.weights),
            format_gib(self.peak_activations), format_gib(self.graph_pools),
            format_gib(self.other), format_gib(max(0, self.kv_budget)))


def kv_budget_bytes(total: int, utilization: float, weights: int, peak_activations: int,
                    graph_pools: int, other: int) -> int:
    """docs/design.md §3's formula. May be negative: size_pool then refuses with the numbers."""
    return int(total * utilization) - weights - peak_activations - graph_pools - other


def dummy_step(spec: ModelSpec, num_tokens: int, block_size: int, null_block: int,
               device: torch.device, decode: bool, num_groups: int = 1) -> AttentionMetadata:
    """Metadata for a synthetic step that writes nothing and reads only the null block.

    decode=False: one prefill of num_tokens tokens (the largest step's activations).
    decode=True: num_tokens sequences of one token each (a captured decode graph's shape).
    Every key read comes from the zero null block, so no KV pool is needed yet.
    """
    if decode:
        seq_lens, qsl, width = [1] * num_tokens, list(range(num_tokens + 1)), 1
    else:
        seq_lens, qsl, width = [num_tokens], [0, num_tokens], -(-num_tokens // block_size)
    return AttentionMetadata(
        slot_mapping=torch.full((num_groups, num_tokens), -1, dtype=torch.long,
                                device=device),
        block_tables=torch.full((num_groups, len(seq_lens), width), null_block,
                                dtype=torch.long, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        num_decodes=num_tokens if decode else 0,
        max_query_len=1 if decode else num_tokens,
        seq_lens_host=seq_lens,
        query_start_loc_host=qsl,
    )


@torch.inference_mode()
def run_dummy_step(model: Any, spec: ModelSpec, dtype: torch.dtype, device: torch.device,
                   num_tokens: int, num_sampled: int, block_size: int, decode: bool,
                   backend: str | None = None) -> torch.Tensor | None:
    """One forward of a synthetic step over a one-block scratch cache; returns the logits
    (None on tensor-parallel ranks other than 0, which run it in step with rank 0).

    Runs on any device (the CPU tests use it); the caller measures memory around it.
    """
    shape = (1, block_size, model.plan.num_kv_heads, spec.head_dim)  # only the null block
    k_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]
    v_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]
    groups = KVCacheGroups.for_windows(spec.layer_windows)
    attention = selection.attention_for(device, k_caches, v_caches, spec.scale, backend,
                                        layers=model.attention_layers(groups))
    attention.set_metadata(dummy_step(spec, num_tokens, block_size, 0, device, decode,
                                      groups.num_groups))
    if model.rotary_positions < num_tokens:
        model.init_rotary(num_tokens)
    ids = torch.zeros(num_tokens, dtype=torch.long, device=device)
    positions = (torch.zeros if decode else torch.arange)(num_tokens, dtype=torch.long,
                                                          device=device)
    rows = torch.arange(num_tokens - min(num_sampled, num_tokens), num_tokens, device=device)
    logits = model(ids, positions, attention, rows)
    if logits is not None:
        # The sampler's largest temporaries: probabilities, and top-p's sorted copy and indices.
        logits.softmax(-1).sort(-1, descending=True)
    return logits


def _peak_of(device: torch.device, fn) -> int:  # type: ignore[no-untyped-def]
    """Bytes allocated at the peak of fn() above what was allocated before it."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    torch.cuda.empty_cache()
    return peak


def profile_cuda(model: Any, spec: ModelSpec, dtype: torch.dtype, device: torch.device,
                 weight_bytes: int, utilization: float, max_num_batched_tokens: int,
                 max_num_seqs: int, block_size: int, graph_batch: int,
                 backend: str | None = None) -> MemoryProfile:
    """Measure the largest step (and a graph-sized decode step when graph_batch > 0)."""
    peak = _peak_of(device, lambda: run_dummy_step(
        model, spec, dtype, device, max_num_batched_tokens, max_num_seqs, block_size,
        decode=False, backend=backend))
    graphs = 0
    if graph_batch > 0:
        graphs = _peak_of(device, lambda: run_dummy_step(
            model, spec, dtype, device, graph_batch, graph_batch, block_size, decode=True,
            backend=backend))
    free, total = torch.cuda.mem_get_info(device)
    # Everything the GPU holds that torch's allocator does not: the CUDA context, cuBLAS
    # workspaces outside the pool, other processes.
    other = max(0, total - free - torch.cuda.memory_reserved(device))
    # Allocated tensors that are not the model's weights (e.g. the rotary table).
    other += max(0, torch.cuda.memory_allocated(device) - weight_bytes)
    profile = MemoryProfile(total=total, utilization=utilization, weights=weight_bytes,
                            peak_activations=peak, graph_pools=graphs, other=other)
    profile.log()
    return profile
