"""The Triton attention backend: same interface as TorchAttention, kernels from kernels/.

A decode-only step (every sequence has one new token: the common case, and the one captured
in CUDA graphs) runs the split-K decode kernel; any step with a prefill runs the varlen
kernel once for all sequences. Both read the paged cache through the metadata's
block_tables / seq_lens / query_start_loc, never the torch path's gathered slots.
"""

from __future__ import annotations

import torch

from engine.attention import AttentionMetadata
from kernels import triton_ops
from kernels.triton_decode_attention import default_num_splits


class TritonAttention:
    """Paged attention with Triton kernels. Set `metadata` before each forward."""

    # ModelRunner.prepare skips building the torch path's [batch, context] gather indices.
    needs_decode_gather = False

    def __init__(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                 scale: float) -> None:
        self.k_caches = k_caches
        self.v_caches = v_caches
        self.scale = scale
        self.metadata: AttentionMetadata | None = None

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        md = self.metadata
        assert md is not None and md.block_tables is not None
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        triton_ops.write_kv_cache(k, v, kc, vc, md.slot_mapping)
        if md.num_decodes == q.shape[0]:
            # Split count from the shape alone, so a graph captured for this batch size is
            # valid for every context length it will later replay with.
            splits = default_num_splits(q.shape[0], kc.shape[2], q.device)
            return triton_ops.paged_decode_attention(
                q, kc, vc, md.block_tables, md.seq_lens, self.scale, num_splits=splits)
        # The longest query is known on the host from the prefill spans: no device sync.
        max_q = max((span.q_len for span in md.prefills), default=1)
        return triton_ops.paged_prefill_attention(
            q, kc, vc, md.block_tables, md.seq_lens, md.query_start_loc, self.scale,
            max_query_len=max_q)
