"""Batch-invariant attention (--batch-invariant): every query row of a step, a prompt's or a
decode's, runs as a decode of its own through one kernel.

The other backends compute a row by whichever path its step gives it: a whole-prompt prefill
(SDPA), a chunk over cached history (the chunk kernel), a decode, a speculative verify. Each
sums the softmax in its own order, so a prompt that hits the prefix cache, or is chunked
differently, or shares its step with others, gets logits that differ in the last bits, and a
near-tied greedy token flips. Here each row attends to its own keys (positions 0 .. its
own) through the decode kernel, whose parts have fixed boundaries (kernels/cpu/
paged_attention.h: Split::kFixed; the Triton kernel with one split): the row's arithmetic
depends on its context alone. The price is prefill attention without shared key loads
(docs/performance.md measures it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from officellm.engine.attention.backend import AttentionMetadata, LayerAttention
from officellm.kernels.ops import RotaryWriteKv

# (q [R, Hq, D], k_cache, v_cache, block_tables [R, W], seq_lens [R], scale, window (0:
# none), sinks [Hq] or None) -> [R, Hq, D]
DecodeAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                            torch.Tensor, float, int, torch.Tensor | None], torch.Tensor]


def rows_as_decodes(md: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query row of the step as a sequence of its own: ([G, T, W] block tables per KV
    cache group, [T] int64 lengths), row t of sequence b attending to its sequence's first
    seq_lens[b] - (rows of b after t) keys. Built from the device tensors (no host sync)."""
    if md.num_decodes == md.num_seqs:  # one row a sequence already (and what graphs capture)
        return md.block_tables, md.seq_lens.long()
    qsl = md.query_start_loc.long()
    rows = md.query_start_loc_host[-1]
    row_seq = torch.repeat_interleave(torch.arange(md.num_seqs, device=qsl.device),
                                      qsl[1:] - qsl[:-1], output_size=rows)
    later_rows = qsl[row_seq + 1] - 1 - torch.arange(rows, device=qsl.device)
    return md.block_tables[:, row_seq], md.seq_lens.long()[row_seq] - later_rows


class RowAttention:
    """AttentionBackend whose every row is a decode of its own (see the module's docstring)."""

    def __init__(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], scale: float,
                 rotary_write_kv: RotaryWriteKv, decode: DecodeAttention,
                 layers: Sequence[LayerAttention]) -> None:
        self.k_caches = k_caches
        self.v_caches = v_caches
        self.scale = scale
        self.layers = list(layers)
        self._rotary_write_kv = rotary_write_kv
        self._decode = decode
        self._tables = torch.empty(0, 0, 0, dtype=torch.long)
        self._lens = torch.empty(0, dtype=torch.long)
        self.metadata: AttentionMetadata | None = None

    def set_metadata(self, metadata: AttentionMetadata) -> None:
        """Take the step's metadata and lay its rows out as decodes, once for every layer."""
        self.metadata = metadata
        self._tables, self._lens = rows_as_decodes(metadata)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate q/k and store k/v in the layer's cache, then attend row by row
        (AttentionBackend.forward)."""
        md = self.metadata
        assert md is not None, "set_metadata before forward"
        info = self.layers[layer]
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        q = self._rotary_write_kv(q, k, v, cos, sin, kc, vc, md.slot_mapping[info.group])
        return self._decode(q, kc, vc, self._tables[info.group], self._lens, self.scale,
                            info.window or 0, info.sinks)
