"""The vocabulary split across tensor-parallel ranks: embedding lookup and LM head.

Each rank holds a contiguous range of vocab_shard rows (ShardPlan.vocab; the last rank's
tail is zero padding). The embedding looks up the ids in its range, zeroes the others, and
an all_reduce assembles every row (a sum with exactly one non-zero term, so it is exact).
The LM head computes this rank's logits and gathers them on rank 0, the only rank that
samples. With tied embeddings both share one weight shard.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from officellm.engine.distributed.parallel_state import ParallelState
from officellm.engine.models import packed_linear
from officellm.engine.models.fixed_order_linear import FixedOrderWeight
from officellm.engine.models.quantized_linear import QuantizedWeight
from officellm.engine.models.shard_plan import ShardPlan


class VocabParallelEmbedding(nn.Module):
    """Token embeddings, this rank's vocabulary rows only."""

    def __init__(self, plan: ShardPlan, hidden_size: int, dtype: torch.dtype,
                 parallel: ParallelState, out_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.plan = plan
        self.parallel = parallel
        # The table is held in `dtype` (a tied head's matmul dtype); rows come out in
        # `out_dtype`, the model's activations'.
        self.out_dtype = out_dtype or dtype
        self.weight = nn.Parameter(torch.empty(plan.vocab_shard, hidden_size, dtype=dtype),
                                   requires_grad=False)
        # The table in blocks, when kept so (one rank only): a lookup dequantizes its rows.
        self.quantized: QuantizedWeight | None = None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None:
            return self.quantized.rows(input_ids, self.out_dtype)
        if self.parallel.world_size == 1:
            return F.embedding(input_ids, self.weight).to(self.out_dtype)
        start = self.plan.rank * self.plan.vocab_shard
        local = input_ids - start
        outside = (local < 0) | (local >= self.plan.vocab_shard)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        x.masked_fill_(outside.unsqueeze(-1), 0)
        return self.parallel.all_reduce(x.to(self.out_dtype))


class ParallelLMHead(nn.Module):
    """Logits over the whole vocabulary on rank 0 (None on the other ranks)."""

    def __init__(self, plan: ShardPlan, hidden_size: int, vocab_size: int, dtype: torch.dtype,
                 parallel: ParallelState, tied: VocabParallelEmbedding | None = None) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.parallel = parallel
        self.tied = tied
        self.weight = None if tied is not None else nn.Parameter(
            torch.empty(plan.vocab_shard, hidden_size, dtype=dtype), requires_grad=False)
        # The weight prepared for a kernel (packed_linear.linear); a tied head prepares its
        # own copy, the embedding lookup keeps reading the plain one.
        self.packed: torch.Tensor | FixedOrderWeight | None = None
        self.quantized: QuantizedWeight | None = None  # blocks (a tied head shares the table's)

    def forward(self, h: torch.Tensor) -> torch.Tensor | None:
        if self.quantized is not None and self.quantized.runs(h):
            return self.quantized(h)[..., : self.vocab_size].float()
        weight = self.tied.weight if self.tied is not None else self.weight
        logits = self.parallel.gather_to_first(packed_linear.linear(h, weight, None, self.packed))
        if logits is None:
            return None
        return logits[..., : self.vocab_size].float()
