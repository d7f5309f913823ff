"""Which dtype the KV cache is stored in (`--kv-cache-dtype`, vLLM's flag).

`auto` stores it in the compute dtype. A float32 engine may store it in 16 bits instead,
halving the bytes per token (twice the tokens in the same pool): the CPU decode kernel
converts on load (kernels/cpu_decode_attention.cpp) and the torch backend casts what it
gathers. The Triton kernels store and read the compute dtype only, so on that backend the
cache dtype must be the compute dtype. vLLM's quantized KV types (fp8, int8) are recognised
and refused with this list, not taken for typos.
"""

from __future__ import annotations

import torch

from engine.dtype_choice import NAMES

KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZED_KV_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2", "int8")
# Backends whose attention reads a cache stored in a dtype other than the compute one.
_CONVERTING_BACKENDS = ("cpu", "torch")


def check_kv_cache_dtype(requested: str) -> None:
    """ValueError (naming the supported values) for a name this build cannot store."""
    name = requested.lower()
    if name == "auto" or name in NAMES:
        return
    supported = ", ".join(KV_CACHE_DTYPES)
    if name in QUANTIZED_KV_DTYPES:
        raise ValueError(f"kv_cache_dtype {requested!r} is not supported by this build's "
                         f"kernels; use one of {supported}.")
    raise ValueError(f"Unknown kv_cache_dtype {requested!r}; use one of {supported}.")


def resolve_kv_cache_dtype(requested: str, compute: torch.dtype, backend: str) -> torch.dtype:
    """The torch dtype of the KV cache for a `--kv-cache-dtype` value, the model's compute
    dtype and the attention backend; ValueError for a combination the kernels cannot run."""
    check_kv_cache_dtype(requested)
    if requested.lower() == "auto":
        return compute
    dtype = NAMES[requested.lower()]
    if dtype == compute:
        return dtype
    if compute != torch.float32 or backend not in _CONVERTING_BACKENDS:
        raise ValueError(
            f"kv_cache_dtype {requested!r} with a {str(compute).removeprefix('torch.')} model "
            f"on the {backend} backend is not supported: a cache in another dtype than the "
            "model's is read only under a float32 model, by the cpu and torch backends.")
    return dtype
