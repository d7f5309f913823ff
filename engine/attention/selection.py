"""Which kernel implementations (and attention backend) the model uses on a given device.

`torch` is the reference path (any device, any dtype); `cpu` is torch plus the C++ paged
decode attention kernel (kernels/cpu/decode_attention.cpp, built on first use); `triton` is
the GPU path. By default the engine picks Triton on CUDA when Triton can be imported, `cpu` on
the CPU when its kernel builds, else torch; EngineConfig.attention_backend (the
`attention_backend` argument of engine.LLM; the server has no flag for it) overrides, which
is how the CPU tests drive the Triton path through Triton's interpreter. With
--batch-invariant every row runs through the cpu or triton backend's decode kernel instead
(engine/attention/row_attention.py). Every backend implements
engine.attention.AttentionBackend.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from officellm.engine.attention.backend import AttentionBackend, LayerAttention, uniform_layers
from officellm.kernels.build import cpu_kernels
from officellm.kernels.ops import KernelOps, kernel_ops, rotary_then_write_kv
from officellm.kernels.triton import triton_available

BACKENDS = ("torch", "cpu", "triton")
# Those whose kernels keep one reduction order per row (--batch-invariant).
BATCH_INVARIANT_BACKENDS = ("cpu", "triton")

logger = logging.getLogger(__name__)


def backend_for(device: torch.device, requested: str | None = None) -> str:
    """The backend name for this device: the requested one, else by device."""
    if requested is not None:
        if requested not in BACKENDS:
            raise ValueError(f"Unknown attention backend {requested!r}; use one of {BACKENDS}.")
        if requested == "triton" and not triton_available():
            raise ValueError("The triton backend needs Triton: pip install 'officellm[gpu]'.")
        if requested == "cpu" and (device.type != "cpu" or cpu_kernels.load() is None):
            raise ValueError("The cpu backend needs a CPU device and a C++ compiler to build "
                             "its kernel; use the torch backend.")
        return requested
    if device.type == "cuda":
        if triton_available():
            return "triton"
        # Silently serving a GPU office at a fraction of its speed would look like a slow GPU.
        logger.warning("Triton cannot be imported: this CUDA GPU runs the torch reference path "
                       "(attention over gathered pages, no CUDA graphs), several times slower "
                       "than the Triton kernels; install them with pip install 'officellm[gpu]'.")
        return "torch"
    if device.type == "cpu" and cpu_kernels.load() is not None:
        return "cpu"
    return "torch"


def ops_for(device: torch.device, backend: str | None = None) -> KernelOps:
    """The norm/rotary/activation/quantized-matmul ops the model calls (the rotary through
    attention_for's backend): Triton's, the C++ kernels or the references
    (kernels.ops.kernel_ops)."""
    name = backend_for(device, backend)
    return kernel_ops(name)


def attention_for(device: torch.device, k_caches: list[torch.Tensor],
                  v_caches: list[torch.Tensor], scale: float,
                  backend: str | None = None, batch_invariant: bool = False,
                  layers: Sequence[LayerAttention] | None = None) -> AttentionBackend:
    """An attention backend over these caches (one per layer): TritonAttention, CpuAttention
    or TorchAttention; with `batch_invariant`, RowAttention over the backend's decode kernel.
    `layers`: each layer's KV cache group, window and sinks (default: one full-attention
    group, no sinks)."""
    name = backend_for(device, backend)
    layers = list(layers) if layers is not None else uniform_layers(len(k_caches))
    if batch_invariant:
        return _row_attention(name, k_caches, v_caches, scale, layers)
    if name == "triton":
        from officellm.engine.attention.triton_backend import TritonAttention

        return TritonAttention(k_caches, v_caches, scale, layers)
    # The torch and cpu backends rotate q/k with the model's own rotary op.
    rotary = kernel_ops(name).apply_rotary
    if name == "cpu":
        from officellm.engine.attention.cpu_backend import CpuAttention

        return CpuAttention(k_caches, v_caches, scale, rotary, layers, cpu_kernels.load())
    from officellm.engine.attention.torch_backend import TorchAttention

    return TorchAttention(k_caches, v_caches, scale, rotary, layers)


def check_batch_invariant(backend: str) -> None:
    """Refuse --batch-invariant where no kernel keeps one reduction order per row."""
    if backend not in BATCH_INVARIANT_BACKENDS:
        raise ValueError(
            f"--batch-invariant needs the cpu or triton backend (their kernels keep one "
            f"reduction order per row); the {backend} backend's SDPA and BLAS calls do not. "
            f"On a CPU, install a C++ compiler (the cpu backend builds its kernels with it).")


def _row_attention(name: str, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                   scale: float, layers: list[LayerAttention]) -> AttentionBackend:
    from officellm.engine.attention.row_attention import RowAttention

    check_batch_invariant(name)
    if name == "triton":
        from officellm.kernels.triton import ops as triton_ops

        # One split: a split count follows the batch's shape, and with it the sum's order.
        def decode(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, tables: torch.Tensor,
                   lens: torch.Tensor, scale: float, window: int,
                   sinks: torch.Tensor | None) -> torch.Tensor:
            return triton_ops.paged_decode_attention(q, kc, vc, tables, lens, scale,
                                                     num_splits=1, window=window, sinks=sinks)

        return RowAttention(k_caches, v_caches, scale, triton_ops.rotary_write_kv, decode,
                            layers)
    kernel = cpu_kernels.load()
    return RowAttention(k_caches, v_caches, scale,
                        rotary_then_write_kv(kernel_ops(name).apply_rotary),
                        kernel.paged_decode_attention, layers)
