"""A dense weight prepared for the batch-invariant matmul (--batch-invariant).

Under the mode every dense matmul of the model (q/k/v, o, gate/up, down, the LM head) runs
through the backend's fixed-order kernel (kernels/cpu/fixed_order_matmul.cpp on the CPU,
kernels/triton/fixed_order_matmul.py on CUDA), whose result for a row does not depend on how
many rows the call has: BLAS's does (an MKL float32 matmul of 1 to 3 rows sums in another
order than one of 4 or more).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from officellm.kernels.ops import FixedOrderMatmul, FixedOrderPack


@dataclass(frozen=True)
class FixedOrderWeight:
    """W in the fixed-order kernel's layout; calling it gives x W^T."""

    packed: torch.Tensor
    out_features: int
    matmul: FixedOrderMatmul

    @classmethod
    def of(cls, weight: torch.Tensor, pack: FixedOrderPack,
           matmul: FixedOrderMatmul) -> FixedOrderWeight:
        """`weight` [N, K] laid out by `pack` for `matmul`."""
        return cls(pack(weight), weight.shape[0], matmul)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.packed, self.out_features)
