"""CPU attention: the torch backend, with decodes through the C++ paged kernel.

Decode attention reads each sequence's keys and values straight from the paged cache
(kernels/cpu_decode_attention.cpp) instead of gathering them into a padded batch first; the
gather was a third of a decode step at office context lengths. Prefills keep SDPA.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.attention.backend import AttentionMetadata
from engine.attention.torch_backend import TorchAttention


class CpuAttention(TorchAttention):
    """TorchAttention whose decodes run the compiled paged decode kernel."""

    def __init__(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], scale: float,
                 kernel: Any) -> None:
        super().__init__(k_caches, v_caches, scale)
        self.kernel = kernel
        self._decode_tables = torch.empty(0, 0, dtype=torch.long)
        self._decode_lens = torch.empty(0, dtype=torch.long)

    def _plan_decodes(self, md: AttentionMetadata) -> None:
        # The kernel takes int64 lengths; converted once per step rather than once per layer.
        self._decode_tables = md.block_tables[: md.num_decodes]
        self._decode_lens = md.seq_lens[: md.num_decodes].long()

    def _decode(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.kernel.paged_decode_attention(q, self.k_caches[layer], self.v_caches[layer],
                                                  self._decode_tables, self._decode_lens,
                                                  self.scale)
