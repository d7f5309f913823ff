"""Torch reference of a mixture-of-experts layer: each family's router and the experts'
grouped SwiGLU/GeGLU, the specification the C++ and Triton MoE kernels are tested against.

A layer's experts are held as two stacked weights (`ExpertWeights`): w13 [E, 2I, H], each
expert's gate rows then its up rows (gpt-oss's checkpoint interleaves them; the loader lays
them out as halves), and w2 [E, H, I], in the model's dtype or as rows of GGUF blocks
(uint8 [E, rows, bytes per row], Q8_0/Q4_K/Q6_K/MXFP4...: kernels/reference/
quant_reference.py). A token's output is the sum, over the k experts its router picked, of
weight x expert(x). Numerics follow transformers' eager loop: experts in ascending id order,
each one's rows gathered, run and added into the output in the activation dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from officellm.kernels.reference import quant_reference

# Router scoring rules (MoESpec.router):
# - "softmax_topk": softmax over every expert in float32, then the top k (Qwen3-MoE,
#   Mixtral); with renormalize, the k weights are divided by their sum.
# - "topk_softmax": the top k logits, then a softmax over those k alone (gpt-oss).
ROUTERS = ("softmax_topk", "topk_softmax")


@dataclass(frozen=True)
class ExpertActivation:
    """The experts' gated activation: "silu" (SwiGLU), "gelu_tanh" (GeGLU) or
    "clamped_swiglu" (gpt-oss: alpha, limit; reference.clamped_swiglu)."""

    kind: str = "silu"
    alpha: float = 1.702
    limit: float = 7.0


@dataclass(frozen=True)
class ExpertWeights:
    """One MoE layer's stacked experts (a tensor-parallel rank's share of each expert's
    intermediate dimension). `fmt13`/`fmt2`: the GGUF type of the blocks (None: dense
    weights in the model's dtype). Biases (gpt-oss) are float32."""

    w13: torch.Tensor  # dense [E, 2I, H]; blocks uint8 [E, 2I, bytes per row of H]
    w2: torch.Tensor  # dense [E, H, I]; blocks uint8 [E, H, bytes per row of I]
    fmt13: int | None = None
    fmt2: int | None = None
    b13: torch.Tensor | None = None  # [E, 2I]
    b2: torch.Tensor | None = None  # [E, H]

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def intermediate_size(self) -> int:
        return self.w13.shape[1] // 2

    def nbytes(self) -> int:
        """Bytes held (every expert resident)."""
        return sum(t.numel() * t.element_size()
                   for t in (self.w13, self.w2, self.b13, self.b2) if t is not None)


def route(logits: torch.Tensor, top_k: int, router: str, renormalize: bool
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, k], expert ids int64 [T, k]) from router logits [T, E], as
    transformers computes them (see ROUTERS)."""
    if router == "softmax_topk":
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, top_k, dim=-1)
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        # transformers casts the weights back to the logits' dtype before using them.
        return weights.to(logits.dtype).float(), ids
    if router == "topk_softmax":
        top, ids = torch.topk(logits, top_k, dim=-1)
        return torch.softmax(top, dim=-1, dtype=top.dtype).float(), ids
    raise ValueError(f"unknown router {router!r}; one of {ROUTERS}")


def activate(h: torch.Tensor, activation: ExpertActivation) -> torch.Tensor:
    """The gated activation of h [R, 2I] (gate half, then up half) -> [R, I]."""
    from officellm.kernels.reference import reference

    if activation.kind == "silu":
        return reference.silu_and_mul(h)
    if activation.kind == "gelu_tanh":
        return reference.gelu_tanh_and_mul(h)
    if activation.kind == "clamped_swiglu":
        return reference.clamped_swiglu(h, activation.alpha, activation.limit)
    raise ValueError(f"unknown expert activation {activation.kind!r}")


def _expert_matmul(x: torch.Tensor, w: torch.Tensor, fmt: int | None) -> torch.Tensor:
    if fmt is None:
        return F.linear(x, w)
    return quant_reference.quant_matmul(x, w, fmt)


def moe_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                experts: ExpertWeights, activation: ExpertActivation) -> torch.Tensor:
    """sum over k of weights[t, k] * expert_{ids[t, k]}(x[t]) for x [T, H]; [T, H] in x's
    dtype. An expert in blocks runs the quantized matmul's reference (activations rounded
    to int8 per 32 values, as the C++ kernel and llama.cpp do)."""
    out = torch.zeros_like(x)
    for e in torch.unique(ids).tolist():  # ascending, as transformers' loop
        tokens, slots = torch.where(ids == e)
        h = _expert_matmul(x[tokens], experts.w13[e], experts.fmt13)
        if experts.b13 is not None:
            h = h + experts.b13[e].to(h.dtype)
        a = activate(h, activation)
        o = _expert_matmul(a, experts.w2[e], experts.fmt2)
        if experts.b2 is not None:
            o = o + experts.b2[e].to(o.dtype)
        o = o * weights[tokens, slots, None].to(o.dtype)
        out.index_add_(0, tokens, o.to(out.dtype))
    return out
