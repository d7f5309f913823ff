"""Column- and row-parallel linear layers (Megatron-LM's split, as in vLLM).

A column-parallel layer holds a slice of the output features and needs no communication:
the fused q/k/v and gate/up matrices hold, per rank, the rows of its heads and of its
intermediate range (ShardPlan cuts them before they are fused). A row-parallel layer holds
the matching slice of the input features, so each rank computes a partial sum of the full
output, and one all_reduce per layer (after o_proj and after down_proj) completes it.
"""

from __future__ import annotations

import torch
from torch import nn

from officellm.engine.distributed.parallel_state import ParallelState
from officellm.engine.models import packed_linear
from officellm.engine.models.fixed_order_linear import FixedOrderWeight
from officellm.engine.models.quantized_linear import QuantizedWeight


class ColumnParallelLinear(nn.Linear):
    """y_local = x W_local^T + b_local: this rank's output features only."""

    def __init__(self, in_features: int, out_features_local: int, bias: bool,
                 dtype: torch.dtype) -> None:
        super().__init__(in_features, out_features_local, bias=bias, dtype=dtype)
        # The weight prepared for a kernel: oneDNN's layout, or the batch-invariant one's
        # (packed_linear.linear reads either).
        self.packed: torch.Tensor | FixedOrderWeight | None = None
        self.quantized: QuantizedWeight | None = None  # the weight in blocks, when kept so

    def reset_parameters(self) -> None:
        """Leave the weight uninitialised: the loader overwrites every element, and nn.Linear's
        random init cost ~0.5 s per engine start for a 135M model (seconds for a 7B one)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None and self.quantized.runs(x):
            y = self.quantized(x)
            return y + self.bias if self.bias is not None else y
        return packed_linear.linear(x, self.weight, self.bias, self.packed)


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_local W_local^T) + b: the bias is added once, after the sum."""

    def __init__(self, in_features_local: int, out_features: int, bias: bool,
                 dtype: torch.dtype, parallel: ParallelState) -> None:
        super().__init__()
        self.parallel = parallel
        self.weight = nn.Parameter(torch.empty(out_features, in_features_local, dtype=dtype),
                                   requires_grad=False)
        self.bias = (nn.Parameter(torch.zeros(out_features, dtype=dtype), requires_grad=False)
                     if bias else None)
        # The weight prepared for a kernel: oneDNN's layout, or the batch-invariant one's
        # (packed_linear.linear reads either).
        self.packed: torch.Tensor | FixedOrderWeight | None = None
        # The weight in blocks, when kept so (one rank only: blocks run along the input
        # features this layer would split).
        self.quantized: QuantizedWeight | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None and self.quantized.runs(x):
            y = self.quantized(x)
            return y + self.bias if self.bias is not None else y
        if self.parallel.world_size == 1:  # bit for bit the unsplit layer
            return packed_linear.linear(x, self.weight, self.bias, self.packed)
        y = self.parallel.all_reduce(packed_linear.linear(x, self.weight, None, self.packed))
        return y + self.bias if self.bias is not None else y
