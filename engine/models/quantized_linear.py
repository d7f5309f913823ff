"""A linear layer's weight kept in GGUF's blocks (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K).

The matmul itself is the kernel's (kernels/cpu/quant_matmul.cpp on the CPU backend, the
torch reference kernels/reference/quant_reference.py on the torch backend): float32 inside, y in x's
dtype. A fused weight (q/k/v, gate/up) whose parts are stored in different types (a Q4_K_M
file mixes them) runs one kernel call per run of rows of one type.

A weight can also be kept both ways (`max_rows`): blocks for batches of up to that many rows
of x, where reading fewer bytes wins, and the layer's dense weight for larger ones, where
arithmetic decides and a float matmul can be the faster (engine/worker/quantization_choice.py
measures where).

A kernel may read the blocks faster in a layout of its own (`pack`: the C++ kernel's groups
of eight rows with their quants pre-transposed); the embedding lookup (`rows`) reads either,
so a table that is also the tied head is held once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from officellm.engine.loading.gguf_tensors import QuantizedTensor
from officellm.kernels.reference import quant_reference

QuantMatmul = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
# (GGUF rows, type) -> the same weight in the layout the matmul reads fastest (or the rows).
QuantPack = Callable[[torch.Tensor, int], torch.Tensor]


@dataclass
class QuantizedWeight:
    """y = x W^T over groups of output rows, each group in one block type."""

    groups: list[QuantizedTensor]
    matmul: QuantMatmul
    max_rows: int | None = None  # larger batches run the dense weight; None: every batch

    @classmethod
    def fuse(cls, parts: Sequence[QuantizedTensor], matmul: QuantMatmul,
             max_rows: int | None = None, pack: QuantPack | None = None) -> QuantizedWeight:
        """The weight whose rows are `parts`' rows in order (neighbours of one type merged),
        each run of one type in `pack`'s layout when given."""
        groups: list[QuantizedTensor] = []
        for part in parts:
            if groups and groups[-1].fmt == part.fmt:
                last = groups.pop()
                part = QuantizedTensor(part.fmt, torch.cat([last.data, part.data]),
                                       part.in_features)
            groups.append(part)
        if pack is not None:
            groups = [QuantizedTensor(g.fmt, pack(g.data, g.fmt), g.in_features) for g in groups]
        return cls(groups, matmul, max_rows)

    def runs(self, x: torch.Tensor) -> bool:
        """Whether x's batch runs over the blocks (else over the dense weight)."""
        return self.max_rows is None or x.numel() <= self.max_rows * x.shape[-1]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        outs = [self.matmul(x, g.data, g.fmt) for g in self.groups]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The dequantized rows `ids` (an embedding lookup); one group only."""
        (group,) = self.groups
        rows = quant_reference.dequantize(group.data, group.fmt, ids.reshape(-1))
        return rows.to(dtype).reshape(*ids.shape, -1)
