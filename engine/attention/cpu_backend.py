"""CPU attention: the torch backend, with decodes through the C++ paged kernel.

Decode attention reads each sequence's keys and values straight from the paged cache
(kernels/cpu_decode_attention.cpp) instead of gathering them into a padded batch first; the
gather was a third of a decode step at office context lengths. A short prompt chunk over a
cached history runs through the same kernel, one query row at a time with its own causal
length: SDPA pays a fixed cost per chunk for gathering and converting the whole history,
which is most of a short chunk's cost, and those are the chunks the prefill pacer gives a
long paste while others type, and an office's turns when the batch is kept small. Longer
chunks keep SDPA.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.attention.backend import AttentionMetadata
from engine.attention.torch_backend import PrefillPlan, TorchAttention

# Up to this many query rows a cached-history chunk runs row by row through the decode
# kernel. Measured on SmolLM2's shape (30 layers, 2 threads, AMD EPYC Zen 4): row by row
# 11.0 against SDPA's 14.6 ms at 16 rows 800 tokens deep, about even at 32 (bf16 and
# float32 queries, 300 to 2,000 tokens deep); SDPA wins beyond.
ROW_BY_ROW_MAX_ROWS = 24


class CpuAttention(TorchAttention):
    """TorchAttention whose decodes run the compiled paged decode kernel."""

    def __init__(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], scale: float,
                 kernel: Any) -> None:
        super().__init__(k_caches, v_caches, scale)
        self.kernel = kernel
        self._decode_tables = torch.empty(0, 0, dtype=torch.long)
        self._decode_lens = torch.empty(0, dtype=torch.long)
        # q_start of a short chunk -> (its block table once per row, each row's causal length)
        self._row_plans: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def set_metadata(self, metadata: AttentionMetadata) -> None:
        super().set_metadata(metadata)
        self._row_plans = {
            p.q_start: (p.blocks.unsqueeze(0).expand(p.q_len, -1).contiguous(),
                        torch.arange(p.seq_len - p.q_len + 1, p.seq_len + 1,
                                     device=p.blocks.device))
            for p in self.prefills if p.blocks is not None and p.q_len <= ROW_BY_ROW_MAX_ROWS}

    def _plan_decodes(self, md: AttentionMetadata) -> None:
        # The kernel takes int64 lengths; converted once per step rather than once per layer.
        self._decode_tables = md.block_tables[: md.num_decodes]
        self._decode_lens = md.seq_lens[: md.num_decodes].long()

    def _decode(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.kernel.paged_decode_attention(q, self.k_caches[layer], self.v_caches[layer],
                                                  self._decode_tables, self._decode_lens,
                                                  self.scale)

    def _prefill(self, layer: int, p: PrefillPlan, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        row_plan = self._row_plans.get(p.q_start)
        if row_plan is None:
            return super()._prefill(layer, p, q, k, v)
        tables, lens = row_plan
        return self.kernel.paged_decode_attention(q.contiguous(), self.k_caches[layer],
                                                  self.v_caches[layer], tables, lens, self.scale)
