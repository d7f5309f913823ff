"""Which dtype the KV cache is stored in (`--kv-cache-dtype`, vLLM's flag and names).

`auto` stores it in the compute dtype, except that a float32 engine (`--dtype auto` on a CPU
without fast bf16) on the cpu or torch backend stores it in bfloat16: half
the bytes per token, twice the tokens in the same pool, with no measurable quality cost
(benchmarks/kv_cache_quality.py: the perplexity within 0.002% and the same top-1 token at
every position of its text) and bf16's whole float32 range, so no key can overflow.
`float32` keeps a float32 cache (the parity tests against transformers pin it). A float32
engine may also ask for float16. The CPU decode kernel converts on load
(kernels/cpu/paged_attention.h: a shift for bf16, F16C for float16) and the torch
backend casts what it gathers. `fp8_e4m3` (vLLM's `fp8`) and `fp8_e5m2` store one byte per
value under any compute dtype and on every backend (the C++ decode kernel, the Triton kernels and the torch
reference all convert on load): half a 16-bit cache, so twice the chats fit. Like vLLM
without calibrated scales, the values are stored unscaled (scale 1.0), saturating at the
format's largest finite value (448 for e4m3) rather than turning into NaN. `int8` (for GPUs
without fp8 units, and the most precise one-byte choice) stores each token's head_dim
values of one KV head as int8 with their own float32 scale (amax / 127) at the end of the row
(kernels/reference/reference.py: quantize_int8_rows), so 4 bytes per row more than fp8: Qwen2.5-7B
29,568 B/token against fp8's 28,672.
"""

from __future__ import annotations

import logging

import torch

from officellm.engine.precision.dtype_choice import NAMES
from officellm.kernels.reference.reference import INT8_SCALE_BYTES
from officellm.kernels.triton import E4M3_MIN_CAPABILITY

FP8_NAMES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
             "fp8_e5m2": torch.float8_e5m2}
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "fp8_e4m3", "fp8_e5m2", "int8")
ONE_BYTE_NAMES = {**FP8_NAMES, "int8": torch.int8}
# vLLM's other spellings of quantized caches that no kernel here reads.
UNSUPPORTED_KV_DTYPES = ("fp8_inc", "fp8_ds_mla", "nvfp4")
logger = logging.getLogger("officellm.engine.precision.kv_cache_dtype")

# Backends whose attention reads a 16-bit cache under a float32 model.
_CONVERTING_BACKENDS = ("cpu", "torch")
# The names the stats, /admin/plan and the console show: vLLM's, not torch's.
_DISPLAY = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2", torch.int8: "int8"}


def check_kv_cache_dtype(requested: str) -> None:
    """ValueError (naming the supported values) for a name this build cannot store."""
    name = requested.lower()
    if name == "auto" or name in NAMES or name in ONE_BYTE_NAMES:
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
        if compute == torch.float32 and backend in _CONVERTING_BACKENDS:
            logger.info("kv_cache_dtype auto -> bfloat16: a float32 model on the %s backend "
                        "stores its KV cache in 16 bits (half the bytes per token; "
                        "--kv-cache-dtype float32 keeps 32)", backend)
            return torch.bfloat16
        return compute
    if name in ONE_BYTE_NAMES:
        dtype = ONE_BYTE_NAMES[name]
        # Triton converts to and from e4m3 only on GPUs with fp8 units (Ada, Hopper: sm_89+).
        if (dtype == torch.float8_e4m3fn and backend == "triton" and cuda_capability
                and cuda_capability < E4M3_MIN_CAPABILITY):
            raise ValueError(
                f"kv_cache_dtype {requested!r} needs a GPU of compute capability 8.9 or newer "
                f"(this one is {cuda_capability[0]}.{cuda_capability[1]}); use int8, fp8_e5m2 "
                "or auto.")
        return dtype
    dtype = NAMES[name]
    if dtype == compute:
        return dtype
    if compute != torch.float32 or backend not in _CONVERTING_BACKENDS:
        raise ValueError(
            f"kv_cache_dtype {requested!r} with a {str(compute).removeprefix('torch.')} model "
            f"on the {backend} backend is not supported: a 16-bit cache in another dtype than "
            "the model's is read only under a float32 model, by the cpu and torch backends "
            "(fp8_e4m3, fp8_e5m2 and int8 are read everywhere).")
    return dtype


def kv_dtype_name(dtype: torch.dtype) -> str:
    """The name a cache dtype is reported under ("float16", "fp8_e4m3", ...)."""
    return _DISPLAY.get(dtype, str(dtype).removeprefix("torch."))


def kv_dtype_bytes(name: str, compute_bytes: int) -> tuple[int, int]:
    """(bytes per stored value, bytes of scale per stored row) for a `--kv-cache-dtype` name
    (`auto`: the compute dtype's, as on a GPU, which is what `officellm plan` sizes)."""
    check_kv_cache_dtype(name)
    name = name.lower()
    if name == "auto":
        return compute_bytes, 0
    dtype = ONE_BYTE_NAMES.get(name) or NAMES[name]
    return dtype.itemsize, scale_bytes(dtype)


def scale_bytes(dtype: torch.dtype) -> int:
    """Bytes each stored row of head_dim values carries besides them: int8's float32 scale."""
    return INT8_SCALE_BYTES if dtype == torch.int8 else 0
