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

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from officellm.engine.distributed.parallel_state import ParallelState
from officellm.engine.loading.model_spec import MoESpec
from officellm.engine.models.shard_plan import ShardPlan
from officellm.kernels.ops import MoeExperts, MoePack
from officellm.kernels.reference import quant_reference
from officellm.kernels.reference.moe import ExpertActivation, ExpertWeights, route


class MixtureOfExperts(nn.Module):
    """Router and stacked experts of one layer (this rank's share of each expert).

    The experts are held one of two ways: dense (w13, w2 in the model's dtype, allocated when
    a checkpoint's expert tensors arrive), or in blocks (`quantized`: a GGUF's experts, or
    gpt-oss's MXFP4 as it ships), given by `hold` before the dense weights would be, so a
    mixture's experts (most of its bytes) never pass through the dense layout."""

    def __init__(self, moe: MoESpec, hidden_size: int, dtype: torch.dtype, plan: ShardPlan,
                 parallel: ParallelState) -> None:
        super().__init__()
        self.spec = moe
        self.parallel = parallel
        self.hidden_size = hidden_size
        self.dtype = dtype
        e, h, i = moe.num_experts, hidden_size, len(plan.expert_intermediate)
        self.intermediate_size = i

        def param(*shape: int, dt: torch.dtype = dtype) -> nn.Parameter:
            return nn.Parameter(torch.zeros(*shape, dtype=dt), requires_grad=False)

        # The router in float32 whatever the model's dtype (as llama.cpp keeps a GGUF's
        # ffn_gate_inp): 128 x 2048 weights read right after the experts, with the cache cold,
        # took oneDNN's bf16 path 270 us a call on the CPU, float32's 100 us. Its logits are
        # rounded to the model's dtype, where transformers computes them, before the routing.
        self.router = param(e, h, dt=torch.float32)
        self.router_bias = param(e, dt=torch.float32) if moe.router_bias else None
        # Dense experts, allocated by allocate_dense: per expert its gate rows, then its up
        # rows [E, 2I, H]; its down [E, H, I].
        self.w13 = param(0)
        self.w2 = param(0)
        self.b13 = param(e, 2 * i, dt=torch.float32) if moe.expert_bias else None
        self.b2 = param(e, h, dt=torch.float32) if moe.expert_bias else None
        self.activation = ExpertActivation(moe.activation, moe.swiglu_alpha, moe.swiglu_limit)
        # The experts in blocks, when held so (then w13/w2 stay empty).
        self.quantized: ExpertWeights | None = None
        # The experts came whole from `hold` (blocks, or dequantized from them): a
        # checkpoint's expert tensors are not expected any more.
        self.held = False

    def allocate_dense(self) -> None:
        """Room for the dense experts (once), on the router's device."""
        e, h, i = self.spec.num_experts, self.hidden_size, self.intermediate_size
        if self.w13.numel() == 0:
            dev = self.router.device
            self.w13.data = torch.zeros(e, 2 * i, h, dtype=self.dtype, device=dev)
            self.w2.data = torch.zeros(e, h, i, dtype=self.dtype, device=dev)

    def hold(self, experts: ExpertWeights, keep_blocks: bool,
             pack: MoePack | None = None) -> None:
        """Take the layer's experts from blocks (their biases, if any, come with the rest of
        the checkpoint): kept so (in `pack`'s layout), or dequantized into the dense
        weights."""
        if (experts.num_experts, experts.intermediate_size) != (
                self.spec.num_experts, self.intermediate_size):
            raise ValueError(f"Experts in blocks of {experts.num_experts} x "
                             f"{experts.intermediate_size}; the model has "
                             f"{self.spec.num_experts} x {self.intermediate_size}.")
        if keep_blocks:
            blocks = replace(experts, b13=self.b13, b2=self.b2)
            self.quantized = pack(blocks) if pack is not None else blocks
            self.w13.data = self.w13.data.new_empty(0)
            self.w2.data = self.w2.data.new_empty(0)
        else:
            self.allocate_dense()
            for e in range(self.spec.num_experts):
                self.w13.data[e] = _dense(experts.w13[e], experts.fmt13).to(self.dtype)
                self.w2.data[e] = _dense(experts.w2[e], experts.fmt2).to(self.dtype)
        self.held = True

    def experts(self) -> ExpertWeights:
        """The experts as the kernels take them."""
        if self.quantized is not None:
            return self.quantized
        return ExpertWeights(self.w13, self.w2, b13=self.b13, b2=self.b2)

    def forward(self, x: torch.Tensor, moe_experts: MoeExperts) -> torch.Tensor:
        moe = self.spec
        logits = F.linear(x.float(), self.router, self.router_bias).to(x.dtype)
        weights, ids = route(logits, moe.top_k, moe.router, moe.renormalize)
        out = moe_experts(x, weights, ids, self.experts(), self.activation)
        if self.parallel.world_size > 1:
            out = self.parallel.all_reduce(out)
        return out


def _dense(w: torch.Tensor, fmt: int | None) -> torch.Tensor:
    return w if fmt is None else quant_reference.dequantize(w, fmt)


@dataclass(frozen=True)
class ExpertBlocks:
    """How a checkpoint's experts in blocks are held: `formats` the block types kept as
    they are (the backend's MoE kernel reads them: engine/precision/weight_quantization.py decides),
    the others dequantized; `pack` the kernel's layout for them (None: GGUF's rows)."""

    formats: frozenset[int] = frozenset()
    pack: MoePack | None = None

    def keeps(self, fmt: int | None) -> bool:
        return fmt is not None and fmt in self.formats
