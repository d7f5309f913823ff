"""oneDNN weight pre-packing for bf16 matmuls on the CPU.

Eager `F.linear` in bf16 hands oneDNN a plain [out, in] weight, which it lays out anew on
every call. Packing each weight once at load (what torch.compile's freezing pass does for
CPU inference) is bit-identical and made SmolLM2's 30 layers of matmuls 40% cheaper at 16
rows on one core (40.7 -> 24.8 ms), as cheap at 512 rows, never dearer. fp32 is left alone:
oneDNN's packed fp32 path sums in another order, and the fp32 engine is the one held to
transformers' output token for token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from officellm.engine.models.fixed_order_linear import FixedOrderWeight
from officellm.kernels.cpu_features import CpuFeatures, cpu_features

# The batch size oneDNN picks the packed layout for; any number of rows works with it.
BATCH_HINT = 16


def torch_can_pack() -> bool:
    """This torch build has oneDNN's packed linear."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def can_pack(device: torch.device, dtype: torch.dtype,
             features: CpuFeatures | None = None) -> bool:
    """Whether packing applies: bf16 on a CPU that oneDNN can pack bf16 weights on (AVX-512
    BW/VL/DQ or AVX-NE-CONVERT; elsewhere it refuses), with a torch that has the packed
    linear. `features`: the CPU's (default: kernels.cpu_features.cpu_features())."""
    if device.type != "cpu" or dtype != torch.bfloat16 or not torch_can_pack():
        return False
    return (features or cpu_features()).can_pack_bf16


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The weight in oneDNN's layout (same shape, opaque order: only `linear` may read it)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), BATCH_HINT)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           packed: torch.Tensor | FixedOrderWeight | None) -> torch.Tensor:
    """F.linear, through the prepared weight when there is one: oneDNN's packed layout, or
    the batch-invariant kernel's (engine/models/fixed_order_linear.py). A weight held in
    another dtype than x (bf16 dense weights under float32 activations) is run in the
    weight's dtype, the result returned in x's."""
    held = packed.dtype if isinstance(packed, torch.Tensor) else weight.dtype
    if x.dtype != held and not isinstance(packed, FixedOrderWeight):
        return linear(x.to(held), weight, bias, packed).to(x.dtype)
    if packed is None:
        return F.linear(x, weight, bias)
    if isinstance(packed, FixedOrderWeight):
        y = packed(x)
        return y + bias if bias is not None else y
    if x.shape[0] == 0:  # oneDNN refuses empty inputs
        return x.new_empty(0, packed.shape[0])
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
