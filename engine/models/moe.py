"""A mixture-of-experts MLP: the router picks each token's experts, the kernel runs them.

The router is one small matmul and its family's scoring rule (kernels/reference/moe.py
`route`: softmax then top-k, renormalized or not; gpt-oss's top-k then softmax, with a bias),
run as torch ops on every device. The experts run through the backend's `moe_experts`
kernel, which groups the step's tokens by expert so each expert's weights are read once per
step (the C++ kernel on the CPU, the fused Triton kernel on CUDA, the reference elsewhere).

Under tensor parallelism every rank holds every expert's slice of the intermediate
dimension (ShardPlan.expert_intermediate) and the router whole: each rank computes its
partial sums and one all_reduce completes them, as for a dense MLP's down projection. The
down projection's bias is held by rank 0 alone, so the sum adds it once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from officellm.engine.distributed.parallel_state import ParallelState
from officellm.engine.loading.model_spec import MoESpec
from officellm.engine.models.shard_plan import ShardPlan
from officellm.kernels.ops import MoeExperts
from officellm.kernels.reference.moe import ExpertActivation, ExpertWeights, route


class MixtureOfExperts(nn.Module):
    """Router and stacked experts of one layer (this rank's share of each expert)."""

    def __init__(self, moe: MoESpec, hidden_size: int, dtype: torch.dtype, plan: ShardPlan,
                 parallel: ParallelState) -> None:
        super().__init__()
        self.spec = moe
        self.parallel = parallel
        e, h, i = moe.num_experts, hidden_size, len(plan.expert_intermediate)
        self.intermediate_size = i

        def param(*shape: int, dt: torch.dtype = dtype) -> nn.Parameter:
            return nn.Parameter(torch.zeros(*shape, dtype=dt), requires_grad=False)

        self.router = param(e, h)
        self.router_bias = param(e) if moe.router_bias else None
        self.w13 = param(e, 2 * i, h)  # per expert: its gate rows, then its up rows
        self.w2 = param(e, h, i)
        self.b13 = param(e, 2 * i, dt=torch.float32) if moe.expert_bias else None
        self.b2 = param(e, h, dt=torch.float32) if moe.expert_bias else None
        self.activation = ExpertActivation(moe.activation, moe.swiglu_alpha, moe.swiglu_limit)
        # The experts as GGUF blocks, when a file's blocks are kept (then w13/w2 are empty).
        self.quantized: ExpertWeights | None = None

    def experts(self) -> ExpertWeights:
        """The experts as the kernels take them."""
        if self.quantized is not None:
            return self.quantized
        return ExpertWeights(self.w13, self.w2, b13=self.b13, b2=self.b2)

    def forward(self, x: torch.Tensor, moe_experts: MoeExperts) -> torch.Tensor:
        moe = self.spec
        logits = F.linear(x, self.router, self.router_bias)
        weights, ids = route(logits, moe.top_k, moe.router, moe.renormalize)
        out = moe_experts(x, weights, ids, self.experts(), self.activation)
        if self.parallel.world_size > 1:
            out = self.parallel.all_reduce(out)
        return out
