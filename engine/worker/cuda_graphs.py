"""CUDA graphs for decode steps: capture once per batch size, replay every step.

A decode step of a 7B model launches a few hundred small kernels; at batch 1 their launch
overhead alone would exceed the time the GPU needs to read the weights. Capturing the whole
forward per batch size removes that. A batch is padded up to the next captured size: padding
rows carry slot -1 (nothing is written to the cache) and sequence length 0 (the decode kernel
returns zeros for them), and their logits are dropped.

With `use_graphs=False` the same static buffers are run eagerly, which is how the padding
and copying logic is tested on the CPU. A replayed graph reads only the static buffers, so
the backend must take per-sequence values from the metadata's device tensors (see
engine.attention.AttentionBackend); TritonAttention does.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from officellm.engine.attention.backend import AttentionBackend, AttentionMetadata

logger = logging.getLogger("officellm.engine.worker.cuda_graphs")


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to max_batch (and max_batch itself)."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_batch]
    sizes += list(range(16, max_batch + 1, 16))
    if max_batch not in sizes:
        sizes.append(max_batch)
    return sorted(set(sizes))


class DecodeGraphs:
    """Replays a captured forward for decode-only steps of up to `max_batch` sequences."""

    def __init__(self, model: Any, attention: AttentionBackend, max_batch: int,
                 max_blocks_per_seq: int, null_block: int, device: torch.device,
                 use_graphs: bool = True, num_groups: int = 1) -> None:
        self.model = model
        self.attention = attention
        self.device = device
        self.use_graphs = use_graphs
        self.sizes = capture_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        n = self.max_batch
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        # Per KV cache group, as AttentionMetadata holds them.
        self.slot_mapping = torch.full((num_groups, n), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.block_tables = torch.full((num_groups, n, max_blocks_per_seq), null_block,
                                       dtype=torch.long, device=device)
        self.rows = torch.arange(n + 1, dtype=torch.long, device=device)
        self.query_start_loc = self.rows.to(torch.int32)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # per size: rows of `logits`
        self.logits: torch.Tensor | None = None  # the largest graph's output, shared by all
        self.pool_bytes = 0

    def _metadata(self, size: int, seq_lens_host: list[int]) -> AttentionMetadata:
        """Metadata whose tensors are views of the static buffers (what the graph reads)."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:, :size],
            block_tables=self.block_tables[:, :size],
            seq_lens=self.seq_lens[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            num_decodes=size,
            max_query_len=1,
            seq_lens_host=seq_lens_host,
            query_start_loc_host=list(range(size + 1)),
        )

    def _forward(self, size: int, seq_lens_host: list[int]) -> torch.Tensor:
        self.attention.set_metadata(self._metadata(size, seq_lens_host))
        return self.model(self.input_ids[:size], self.positions[:size], self.attention,
                          self.rows[:size])

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first, all in one memory pool (a smaller graph reuses
        the larger one's activation memory), every size's logits written into the largest
        one's output. No-op in eager mode."""
        if not self.use_graphs:
            return
        t0 = time.monotonic()
        before = torch.cuda.memory_reserved(self.device)
        pool = None
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for size in reversed(self.sizes):
                # One eager run first: Triton compiles its kernels there, not during capture.
                # The buffers hold zero lengths while capturing; the host mirror says so.
                self._forward(size, [0] * size)
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    out = self._forward(size, [0] * size)
                    if self.logits is not None:
                        # Kept apart, each size's float32 logits would hold pool memory for
                        # good, beside the KV pool and outside the start-up profile (~1.3 GB
                        # for Qwen2.5-7B's vocabulary); copied, the largest's output (which
                        # the profile's graph-sized step measures) holds them all.
                        self.logits[:size].copy_(out)
                if self.logits is None:
                    self.logits = out
                pool = graph.pool() if pool is None else pool
                self.graphs[size] = graph
                self.outputs[size] = self.logits[:size]
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        self.pool_bytes = torch.cuda.memory_reserved(self.device) - before
        logger.info("Captured CUDA graphs for %d decode batch sizes (1..%d) in %.1f s, "
                    "using %.2f GiB", len(self.sizes), self.max_batch, time.monotonic() - t0,
                    self.pool_bytes / 1024**3)

    def can_run(self, num_tokens: int, metadata: AttentionMetadata) -> bool:
        """A decode-only step that fits the largest captured size."""
        return 0 < num_tokens <= self.max_batch and metadata.num_decodes == num_tokens

    def padded_size(self, batch: int) -> int:
        return next(s for s in self.sizes if s >= batch)

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            metadata: AttentionMetadata) -> torch.Tensor:
        """Logits [batch, vocab] (float32) of a decode step, through the padded graph."""
        b = input_ids.shape[0]
        size = self.padded_size(b)
        width = metadata.block_tables.shape[2]
        if width > self.block_tables.shape[2]:
            raise ValueError(f"block table of {width} blocks exceeds the captured "
                             f"{self.block_tables.shape[2]}")
        self.input_ids[:b].copy_(input_ids)
        self.positions[:b].copy_(positions)
        self.slot_mapping[:, :b].copy_(metadata.slot_mapping)
        self.seq_lens[:b].copy_(metadata.seq_lens)
        self.block_tables[:, :b, :width].copy_(metadata.block_tables)
        if size > b:
            # Padding rows: write nothing, attend to nothing. Stale block-table entries
            # beyond a row's length are never read, so they need no reset.
            self.input_ids[b:size].zero_()
            self.positions[b:size].zero_()
            self.slot_mapping[:, b:size].fill_(-1)
            self.seq_lens[b:size].zero_()
        if self.use_graphs:
            self.graphs[size].replay()
            return self.outputs[size][:b]
        return self._forward(size, metadata.seq_lens_host + [0] * (size - b))[:b]
