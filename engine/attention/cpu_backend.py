"""CPU attention: the torch backend, with decodes and short chunks through the C++ kernels.

Decode attention reads each sequence's keys and values straight from the paged cache
(kernels/cpu/decode_attention.cpp) instead of gathering them into a padded batch first; the
gather was a third of a decode step at office context lengths. A prompt chunk over a cached
history runs through the chunk kernel beside it, whose rows share each key and value they
load: SDPA pays a fixed cost per chunk for gathering and converting the whole history, which
is most of a short chunk's cost, and those are the chunks the prefill pacer gives a long
paste while others type, and an office's turns when the batch is kept small. Longer chunks
keep SDPA. Both kernels take a layer's sliding window (they read only the blocks it reaches)
and its sinks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from officellm.engine.attention.backend import AttentionMetadata, LayerAttention
from officellm.engine.attention.torch_backend import PrefillPlan, TorchAttention
from officellm.kernels.ops import ApplyRotary

# Up to this many query rows a cached-history chunk runs through the chunk kernel.
CHUNK_KERNEL_MAX_ROWS = 32


class CpuAttention(TorchAttention):
    """TorchAttention whose decodes and short cached-history chunks run the compiled paged
    kernels."""

    def __init__(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], scale: float,
                 rotary: ApplyRotary, layers: Sequence[LayerAttention], kernel: Any) -> None:
        super().__init__(k_caches, v_caches, scale, rotary, layers)
        self.kernel = kernel
        self._decode_tables: dict[int, torch.Tensor] = {}
        self._decode_lens = torch.empty(0, dtype=torch.long)

    def _plan_decodes(self, md: AttentionMetadata, group: int, window: int | None) -> None:
        # The kernel takes int64 lengths; converted once per step rather than once per layer.
        self._decode_tables[group] = md.block_tables[group, : md.num_decodes]
        self._decode_lens = md.seq_lens[: md.num_decodes].long()

    def _decode(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        info = self.layers[layer]
        return self.kernel.paged_decode_attention(
            q, self.k_caches[layer], self.v_caches[layer], self._decode_tables[info.group],
            self._decode_lens, self.scale, info.window or 0, info.sinks)

    def _prefill(self, layer: int, p: PrefillPlan, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        # The chunk kernel is causal: a chunk with an image's two-way span runs SDPA's mask.
        if p.table is None or p.q_len > CHUNK_KERNEL_MAX_ROWS or p.bidirectional:
            return super()._prefill(layer, p, q, k, v)
        info = self.layers[layer]
        return self.kernel.paged_chunk_attention(q, self.k_caches[layer], self.v_caches[layer],
                                                 p.table, p.seq_len, self.scale,
                                                 info.window or 0, info.sinks)
