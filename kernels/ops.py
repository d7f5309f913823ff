"""KernelOps: the per-layer ops the model calls (norms, rotary, activations, quantized matmul,
a mixture-of-experts layer's experts; the rotary through its attention backend, which
rotates q/k as it stores them), and
kernel_ops(), the one place that picks them for a backend: the CPU's compiled kernels,
Triton's, or the torch references.

On the CPU the compiled fused kernels run where the layout allows and the torch references
elsewhere (same signatures as kernels/reference/reference.py, same numbers).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from officellm.kernels.build import cpu_kernels
from officellm.kernels.reference import moe, quant_reference, reference
from officellm.kernels.reference.moe import ExpertActivation, ExpertWeights


class RmsNorm(Protocol):
    def __call__(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...


class FusedAddRmsNorm(Protocol):
    def __call__(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]: ...


class ApplyRotary(Protocol):
    """Neox rotary of q [T, Hq, D] and k [T, Hk, D] by cos/sin [T, R], R <= D (partial
    rotary: each head's last D - R values pass through)."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class RotaryWriteKv(Protocol):
    """The neox rotary of q [T, Hq, D] and k [T, Hk, D] with cos/sin [T, R]; the rotated k and
    v stored into the caches at the flat slots (-1: none, as write_kv_cache); returns the
    rotated q."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, /) -> torch.Tensor: ...


def rotary_then_write_kv(rotary: ApplyRotary) -> RotaryWriteKv:
    """RotaryWriteKv as two steps, `rotary` then the reference's KV write: what the Triton
    kernel (kernels/triton/rotary_kv_cache.py) does in one, for the CPU."""

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
            sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            slot_mapping: torch.Tensor, /) -> torch.Tensor:
        q, k = rotary(q, k, cos, sin)
        reference.write_kv_cache(k, v, k_cache, v_cache, slot_mapping)
        return q

    return run


class SiluAndMul(Protocol):
    """x [T, 2I] holding gate then up -> silu(gate) * up, [T, I]."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class GeluTanhAndMul(Protocol):
    """x [T, 2I] holding gate then up -> gelu(gate, tanh approximation) * up, [T, I]
    (Gemma's GeGLU)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class QuantMatmul(Protocol):
    """y = x W^T over GGUF blocks of type `fmt` (kernels/reference/quant_reference.py)."""

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, fmt: int, /) -> torch.Tensor: ...


class QuantPack(Protocol):
    """GGUF rows in the layout quant_matmul reads fastest (or the rows themselves)."""

    def __call__(self, weight: torch.Tensor, fmt: int, /) -> torch.Tensor: ...


class FixedOrderPack(Protocol):
    """A dense [N, K] weight in the layout fixed_order_matmul reads."""

    def __call__(self, weight: torch.Tensor, /) -> torch.Tensor: ...


class FixedOrderMatmul(Protocol):
    """y = x W^T [M, n] over fixed_order_pack's layout of W, each row's result independent of
    the other rows and of M (the --batch-invariant mode's dense matmul)."""

    def __call__(self, x: torch.Tensor, packed: torch.Tensor, n: int, /) -> torch.Tensor: ...


class MoeExperts(Protocol):
    """A MoE layer's experts (kernels/reference/moe.py moe_experts): x [T, H], the router's
    weights float32 [T, k] and expert ids int64 [T, k] -> [T, H] in x's dtype."""

    def __call__(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                 experts: ExpertWeights, activation: ExpertActivation, /) -> torch.Tensor: ...


class MoePack(Protocol):
    """A MoE layer's experts in the layout moe_experts reads fastest (blocks: each expert's
    matrices in quant_pack's layout; dense experts as they are)."""

    def __call__(self, experts: ExpertWeights, /) -> ExpertWeights: ...


@dataclass(frozen=True)
class KernelOps:
    """The ops a decoder layer calls, all from one implementation (apply_rotary through the
    torch and cpu attention backends; the Triton backend fuses it with the KV write)."""

    rms_norm: RmsNorm
    fused_add_rms_norm: FusedAddRmsNorm
    apply_rotary: ApplyRotary
    silu_and_mul: SiluAndMul
    gelu_tanh_and_mul: GeluTanhAndMul
    # Weights in blocks run on the CPU only (engine/precision/weight_quantization.py): None on Triton.
    quant_matmul: QuantMatmul | None
    quant_pack: QuantPack | None  # None: quant_matmul reads GGUF's rows as they are
    moe_experts: MoeExperts
    moe_pack: MoePack | None  # None: moe_experts reads GGUF's rows as they are
    # The batch-invariant dense matmul: None on the torch references (BLAS's order is its own).
    fixed_order_pack: FixedOrderPack | None = None
    fixed_order_matmul: FixedOrderMatmul | None = None


def kernel_ops(implementation: str) -> KernelOps:
    """The ops of `implementation`: "cpu" (the compiled kernels, which must load),
    "triton" (imports Triton) or "torch" (the references)."""
    if implementation not in ("cpu", "triton", "torch"):
        raise ValueError(f"no kernel ops named {implementation!r}")
    if implementation == "cpu":
        module = cpu_kernels.load()
        if module is None:
            raise RuntimeError("the CPU kernels did not build (see the log); use the torch ops")
        compiled = _CompiledOps(module)
        return KernelOps(rms_norm=compiled.rms_norm,
                         fused_add_rms_norm=compiled.fused_add_rms_norm,
                         apply_rotary=compiled.apply_rotary, silu_and_mul=compiled.silu_and_mul,
                         gelu_tanh_and_mul=compiled.gelu_tanh_and_mul,
                         quant_matmul=module.quant_matmul, quant_pack=module.quant_pack,
                         moe_experts=compiled.moe_experts,
                         moe_pack=pack_experts(module.quant_pack),
                         fixed_order_pack=module.fixed_order_pack,
                         fixed_order_matmul=module.fixed_order_matmul)
    if implementation == "triton":
        from officellm.kernels.triton import (
            ops as triton_ops,  # imported only here: the CPU never needs it
        )

        return KernelOps(rms_norm=triton_ops.rms_norm,
                         fused_add_rms_norm=triton_ops.fused_add_rms_norm,
                         apply_rotary=triton_ops.apply_rotary,
                         silu_and_mul=triton_ops.silu_and_mul,
                         gelu_tanh_and_mul=triton_ops.gelu_tanh_and_mul, quant_matmul=None,
                         quant_pack=None, moe_experts=triton_ops.moe_experts, moe_pack=None,
                         fixed_order_pack=_contiguous,
                         fixed_order_matmul=_triton_fixed_order_matmul)
    return KernelOps(rms_norm=reference.rms_norm, fused_add_rms_norm=reference.fused_add_rms_norm,
                     apply_rotary=reference.apply_rotary, silu_and_mul=reference.silu_and_mul,
                     gelu_tanh_and_mul=reference.gelu_tanh_and_mul,
                     quant_matmul=quant_reference.quant_matmul, quant_pack=None,
                     moe_experts=moe.moe_experts, moe_pack=None)


class _CompiledOps:
    """The compiled fused kernels of `module` where the tensors' layout allows, the torch
    references elsewhere."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # [T, H] rows, or the per-head q/k norms' [T, heads, D] views of the qkv output.
        if x.dim() in (2, 3) and x.stride(-1) == 1 and weight.dtype == x.dtype:
            return self._module.rms_norm(x, weight, eps)
        return reference.rms_norm(x, weight, eps)

    def fused_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dim() == 2 and x.dtype == residual.dtype == weight.dtype:
            return self._module.fused_add_rms_norm(x, residual, weight, eps)
        return reference.fused_add_rms_norm(x, residual, weight, eps)

    def apply_rotary(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Any rotated width R <= D (partial rotary included) runs compiled.
        if cos.dtype == torch.float32 and _heads_contiguous(q) and _heads_contiguous(k):
            return self._module.apply_rotary(q, k, cos, sin)
        return reference.apply_rotary(q, k, cos, sin)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        if _rows_contiguous(x):
            return self._module.silu_and_mul(x)
        return reference.silu_and_mul(x)

    def gelu_tanh_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        if _rows_contiguous(x):
            return self._module.gelu_tanh_and_mul(x)
        return reference.gelu_tanh_and_mul(x)

    def moe_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                    experts: ExpertWeights, activation: ExpertActivation) -> torch.Tensor:
        # The kernel takes the stacks and their formats as arguments (-1: dense).
        return self._module.moe_experts(
            x, weights, ids, experts.w13, _format_arg(experts.fmt13), experts.w2,
            _format_arg(experts.fmt2), experts.b13, experts.b2, activation.kind,
            activation.alpha, activation.limit)


def pack_experts(quant_pack: QuantPack) -> MoePack:
    """MoePack by `quant_pack` per expert, at load: a packed block costs a few loads where
    GGUF's rows cost transposes and scalar scale decoding, for about the same bytes (a
    K-quant's at most 6% more), and the MoE kernel ran 1.4 to 2.7 times as fast on it
    (benchmarks/moe_kernel_speed.py)."""

    def pack(w: torch.Tensor, fmt: int | None) -> torch.Tensor:
        if fmt is None:
            return w
        packed = [quant_pack(w[e], fmt) for e in range(w.shape[0])]
        # quant_pack keeps the rows [N, bytes] it cannot pack (a portable build, N not a
        # multiple of 8).
        return w if packed[0].dim() == 2 else torch.stack(packed)

    def run(experts: ExpertWeights) -> ExpertWeights:
        return replace(experts, w13=pack(experts.w13, experts.fmt13),
                       w2=pack(experts.w2, experts.fmt2))

    return run


def _format_arg(fmt: int | None) -> int:
    return -1 if fmt is None else fmt


def _contiguous(weight: torch.Tensor) -> torch.Tensor:
    """Triton's fixed-order matmul reads nn.Linear's own [N, K] layout."""
    return weight.contiguous()


def _triton_fixed_order_matmul(x: torch.Tensor, weight: torch.Tensor, n: int) -> torch.Tensor:
    from officellm.kernels.triton import ops as triton_ops

    return triton_ops.fixed_order_matmul(x, weight)


def _rows_contiguous(x: torch.Tensor) -> bool:
    """[T, 2I] rows the compiled gated activations read (unit inner stride)."""
    return x.dim() == 2 and x.stride(1) == 1


def _heads_contiguous(t: torch.Tensor) -> bool:
    return t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2]
