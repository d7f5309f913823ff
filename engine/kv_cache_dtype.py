"""Which dtype the KV cache is stored in (`--kv-cache-dtype`, vLLM's flag and names).

`auto` stores it in the compute dtype. A float32 engine may store it in 16 bits instead,
halving the bytes per token (twice the tokens in the same pool): the CPU decode kernel
converts on load (kernels/cpu_decode_attention.cpp) and the torch backend casts what it
gathers. `fp8_e4m3` (vLLM's `fp8`) and `fp8_e5m2` store one byte per value under any
compute dtype and on every backend (the C++ decode kernel, the Triton kernels and the torch
reference all convert on load): half a 16-bit cache, so twice the chats fit. Like vLLM
without calibrated scales, the values are stored unscaled (scale 1.0), saturating at the
format's largest finite value (448 for e4m3) rather than turning into NaN. `int8` needs a
scale per stored row, which the kernels do not read yet: it is recognised and refused with
the supported list, not taken for a typo.
"""

from __future__ import annotations

import torch

from engine.dtype_choice import NAMES

FP8_NAMES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
             "fp8_e5m2": torch.float8_e5m2}
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "fp8_e4m3", "fp8_e5m2")
UNSUPPORTED_KV_DTYPES = ("int8",)
# Backends whose attention reads a 16-bit cache under a float32 model.
_CONVERTING_BACKENDS = ("cpu", "torch")
# The names the stats, /admin/plan and the console show: vLLM's, not torch's.
_DISPLAY = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}


def check_kv_cache_dtype(requested: str) -> None:
    """ValueError (naming the supported values) for a name this build cannot store."""
    name = requested.lower()
    if name == "auto" or name in NAMES or name in FP8_NAMES:
        return
    supported = ", ".join(KV_CACHE_DTYPES)
    if name in UNSUPPORTED_KV_DTYPES:
        raise ValueError(f"kv_cache_dtype {requested!r} is not supported by this build's "
                         f"kernels; use one of {supported}.")
    raise ValueError(f"Unknown kv_cache_dtype {requested!r}; use one of {supported}.")


def resolve_kv_cache_dtype(requested: str, compute: torch.dtype, backend: str,
                           cuda_capability: tuple[int, int] | None = None) -> torch.dtype:
    """The torch dtype of the KV cache for a `--kv-cache-dtype` value, the model's compute
    dtype and the attention backend (and the GPU's compute capability, for Triton's fp8);
    ValueError for a combination the kernels cannot run."""
    check_kv_cache_dtype(requested)
    name = requested.lower()
    if name == "auto":
        return compute
    if name in FP8_NAMES:
        dtype = FP8_NAMES[name]
        # Triton converts to and from e4m3 only on GPUs with fp8 units (Ada, Hopper: sm_89+).
        if (dtype == torch.float8_e4m3fn and backend == "triton" and cuda_capability
                and cuda_capability < (8, 9)):
            raise ValueError(
                f"kv_cache_dtype {requested!r} needs a GPU of compute capability 8.9 or newer "
                f"(this one is {cuda_capability[0]}.{cuda_capability[1]}); use fp8_e5m2 or "
                "auto.")
        return dtype
    dtype = NAMES[name]
    if dtype == compute:
        return dtype
    if compute != torch.float32 or backend not in _CONVERTING_BACKENDS:
        raise ValueError(
            f"kv_cache_dtype {requested!r} with a {str(compute).removeprefix('torch.')} model "
            f"on the {backend} backend is not supported: a 16-bit cache in another dtype than "
            "the model's is read only under a float32 model, by the cpu and torch backends "
            "(fp8_e4m3 and fp8_e5m2 are read everywhere).")
    return dtype


def kv_dtype_name(dtype: torch.dtype) -> str:
    """The name a cache dtype is reported under ("float16", "fp8_e4m3", ...)."""
    return _DISPLAY.get(dtype, str(dtype).removeprefix("torch."))


def kv_dtype_bytes(name: str, compute_bytes: int) -> int:
    """Bytes per stored value for a `--kv-cache-dtype` name (`auto`: the compute dtype's)."""
    check_kv_cache_dtype(name)
    name = name.lower()
    if name == "auto":
        return compute_bytes
    return (FP8_NAMES.get(name) or NAMES[name]).itemsize
