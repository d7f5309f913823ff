"""CPU attention: the torch backend, with decodes through the C++ paged kernel.

Decode attention reads each sequence's keys and values straight from the paged cache
(kernels/cpu_decode_attention.cpp) instead of gathering them into a padded batch first; the
gather was a third of a decode step at office context lengths. Prefills keep SDPA.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.attention import AttentionMetadata, TorchAttention


class CpuAttention(TorchAttention):
    """TorchAttention whose decodes run the compiled paged decode kernel."""

    needs_decode_gather = False

    def __init__(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], scale: float,
                 kernel: Any) -> None:
        super().__init__(k_caches, v_caches, scale)
        self.kernel = kernel

    def _decode(self, q, kflat, vflat, md: AttentionMetadata, group: int) -> torch.Tensor:
        # kflat is a view of one layer's cache; the kernel wants the paged shape back.
        bs = self.k_caches[0].shape[1]
        kc = kflat.view(-1, bs, *kflat.shape[1:])
        vc = vflat.view(-1, bs, *vflat.shape[1:])
        return self.kernel.paged_decode_attention(q, kc, vc, md.decode_block_tables,
                                                  md.decode_seq_lens, self.scale)

