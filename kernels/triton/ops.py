"""The Triton implementations under the reference's names (kernels.ops.kernel_ops picks them).
Importing this imports Triton, so only the CUDA path (and the kernel tests, under
TRITON_INTERPRET=1) does."""

from __future__ import annotations

from officellm.kernels.triton.activation import gelu_tanh_and_mul, silu_and_mul
from officellm.kernels.triton.decode_attention import paged_decode_attention
from officellm.kernels.triton.fixed_order_matmul import fixed_order_matmul
from officellm.kernels.triton.fused_moe import moe_experts
from officellm.kernels.triton.kv_cache import write_kv_cache
from officellm.kernels.triton.norm import fused_add_rms_norm, rms_norm
from officellm.kernels.triton.prefill_attention import paged_prefill_attention
from officellm.kernels.triton.rotary import apply_rotary
from officellm.kernels.triton.rotary_kv_cache import rotary_write_kv

# The reference's varlen entry point: the prefill kernel handles any mix of query lengths.
paged_attention = paged_prefill_attention

__all__ = [
    "apply_rotary", "fixed_order_matmul", "fused_add_rms_norm", "gelu_tanh_and_mul",
    "moe_experts", "paged_attention", "paged_decode_attention", "paged_prefill_attention",
    "rms_norm", "rotary_write_kv", "silu_and_mul", "write_kv_cache",
]
