"""The Triton attention backend: the AttentionBackend protocol over kernels/ Triton kernels.

Each layer's forward first runs the rotary fused with the KV-cache write (one kernel: the
rotated keys go straight into the cache), then attention on the rotated queries it returns.
A decode-only step (every sequence has one new token: the common case, and the one captured
in CUDA graphs) runs the split-K decode kernel; any step with a prefill runs the varlen
kernel once for all sequences. Both read the paged cache through the metadata's
block_tables / seq_lens / query_start_loc on the device, which is what lets a captured
graph replay with new lengths.

The varlen kernel is causal: a prefill chunk holding an image whose tokens attend to each
other both ways (Gemma 3) has its rows computed again by the torch reference over the
cache the kernel wrote (TorchAttention.cached_prefill), only in steps with such a chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from officellm.engine.attention.backend import AttentionMetadata, LayerAttention
from officellm.engine.attention.torch_backend import TorchAttention
from officellm.kernels.triton import ops as triton_ops
from officellm.kernels.triton.decode_attention import default_num_splits


class TritonAttention:
    """Paged attention with Triton kernels."""

    def __init__(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                 scale: float, layers: Sequence[LayerAttention]) -> None:
        self.k_caches = k_caches
        self.v_caches = v_caches
        self.scale = scale
        self.layers = list(layers)
        self.metadata: AttentionMetadata | None = None
        # The reference that runs chunks with a two-way span (made on first need).
        self._two_way: TorchAttention | None = None

    def set_metadata(self, metadata: AttentionMetadata) -> None:
        """Take the step's metadata (the kernels read it as it is)."""
        self.metadata = metadata
        if metadata.bidirectional is not None:
            if self._two_way is None:
                self._two_way = TorchAttention(self.k_caches, self.v_caches, self.scale,
                                               _no_rotary, self.layers)
            self._two_way.set_metadata(metadata)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate q/k and store k/v in the layer's cache in one launch, then attend (see
        AttentionBackend.forward)."""
        md = self.metadata
        assert md is not None, "set_metadata before forward"
        info = self.layers[layer]
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        tables = md.block_tables[info.group]
        q = triton_ops.rotary_write_kv(q, k, v, cos, sin, kc, vc, md.slot_mapping[info.group])
        if md.num_decodes == q.shape[0]:
            # Split count from the shape alone, so a graph captured for this batch size is
            # valid for every context length it will later replay with.
            splits = default_num_splits(q.shape[0], kc.shape[2], q.device)
            return triton_ops.paged_decode_attention(
                q, kc, vc, tables, md.seq_lens, self.scale, num_splits=splits,
                window=info.window or 0, sinks=info.sinks)
        out = triton_ops.paged_prefill_attention(
            q, kc, vc, tables, md.seq_lens, md.query_start_loc, self.scale,
            max_query_len=md.max_query_len, window=info.window or 0, sinks=info.sinks)
        if md.bidirectional is not None and self._two_way is not None:
            for plan in self._two_way.prefills[info.group]:
                if plan.bidirectional:
                    rows = slice(plan.q_start, plan.q_start + plan.q_len)
                    out[rows] = self._two_way.cached_prefill(layer, plan, q[rows])
        return out


def _no_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The fallback's rotary: never called (it attends over rows already rotated)."""
    raise AssertionError("the two-way fallback does not rotate")
