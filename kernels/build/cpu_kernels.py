"""The CPU's C++ kernels (kernels/cpu/), built on first use: paged decode and chunk attention
(decode_attention.cpp, chunk_attention.cpp), the fused per-layer ops (fused_ops.cpp), the
quantized matmul (quant_matmul.cpp and its ISA paths), the mixture-of-experts layer's experts
(moe.cpp, on the quantized matmul's tiles) and the batch-invariant dense matmul
(fixed_order_matmul.cpp), one module exposed by bindings.cpp.

The instruction set is chosen at run time, never by `-march=native`: `build_level()` reads
this CPU's flags (kernels.cpu_features, so OFFICELLM_CPU_ISA=avx2 makes an AVX-512 machine
run the AVX2 code) and names one of three builds, AVX-512 (with VNNI and BF16 where the CPU
has them), AVX2 + FMA + F16C, or baseline x86-64. Each is compiled once into the user cache
by kernels/build/extension_cache.py, which keys it by everything it depends on and survives a
build killed midway; later starts, of any install with the same key, load it in well under a
second. A cache copied to another CPU loads only the level that CPU can run. Where no C++
compiler is installed, `load()` returns None, says why in one WARNING, and the engine keeps
the torch reference path.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from officellm.kernels.build.extension_cache import ExtensionBuild, SourceFile
from officellm.kernels.cpu_features import CpuFeatures, cpu_features

logger = logging.getLogger("officellm.kernels")

SOURCE_DIR = Path(__file__).parent.parent / "cpu"
DISABLE_ENV = "OFFICELLM_NO_CPU_KERNELS"

# -ffp-contract=off: a*b + c*d as torch computes it (no fused multiply-add), so the fused
# ops round exactly where the references do.
CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")
# Where reassociation and finite math are wanted (the attention's vectorized exp and sums).
# The matmuls never get it: their float operations keep one fixed order (quant_matmul.cpp's,
# moe.cpp's and fixed_order_matmul.cpp's headers).
FAST_MATH = ("-ffast-math", "-ffp-contract=off")  # -ffast-math alone would turn contraction on
SOURCES = (SourceFile(SOURCE_DIR / "decode_attention.cpp", FAST_MATH),
           SourceFile(SOURCE_DIR / "chunk_attention.cpp", FAST_MATH),
           SourceFile(SOURCE_DIR / "fused_ops.cpp", FAST_MATH),
           SourceFile(SOURCE_DIR / "quant_matmul.cpp"),
           SourceFile(SOURCE_DIR / "fixed_order_matmul.cpp"),
           SourceFile(SOURCE_DIR / "moe.cpp"),
           SourceFile(SOURCE_DIR / "bindings.cpp"))
HEADERS = tuple(SOURCE_DIR / name for name in
                ("entry_points.h", "paged_attention.h", "quant_matmul_formats.h",
                 "quant_matmul_avx2.h", "quant_matmul_portable.h"))
_BASELINE = ("-march=x86-64-v2",)
_AVX2 = (*_BASELINE, "-mavx2", "-mfma", "-mf16c")
_AVX512 = (*_AVX2, "-mavx512f", "-mavx512cd", "-mavx512bw", "-mavx512dq", "-mavx512vl")


@dataclass(frozen=True)
class BuildLevel:
    """One build of the kernels: its name and the instruction sets it may use."""

    name: str
    isa_flags: tuple[str, ...]


def build_level(features: CpuFeatures | None = None) -> BuildLevel:
    """The build this CPU runs (default: kernels.cpu_features.cpu_features(), after caps)."""
    flags = (features or cpu_features()).flags
    if _AVX512_NEEDS <= flags:
        name, isa = "avx512", list(_AVX512)
        if "avx512_vnni" in flags:
            name, isa = name + "_vnni", [*isa, "-mavx512vnni"]
        if "avx512_bf16" in flags:
            name, isa = name + "_bf16", [*isa, "-mavx512bf16"]
        return BuildLevel(name, tuple(isa))
    if {"avx2", "fma", "f16c"} <= flags:
        return BuildLevel("avx2", _AVX2)
    return BuildLevel("x86-64", _BASELINE)


_AVX512_NEEDS = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512cd", "avx512bw",
                           "avx512dq", "avx512vl"})

_lock = threading.Lock()
_modules: dict[BuildLevel, Any] = {}


def load(level: BuildLevel | None = None) -> Any | None:
    """The compiled module for `level` (default: this CPU's), or None when it cannot be
    built. Each level is built and loaded once per process."""
    level = level or build_level()
    with _lock:
        if level not in _modules:
            _modules[level] = _build(level)
        return _modules[level]


def _build(level: BuildLevel) -> Any | None:
    if os.environ.get(DISABLE_ENV):
        logger.info("CPU kernels disabled by %s; using the torch path", DISABLE_ENV)
        return None
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        logger.warning("No C++ compiler (%s) found: the CPU kernels are not built and the "
                       "engine uses the slower torch path", compiler)
        return None
    logger.info("Loading the CPU kernels for %s (built once per machine, ~1 min the first "
                "time)", level.name)
    try:
        return kernel_build(level, compiler).load()
    except Exception as exc:  # a broken toolchain must not stop the server
        logger.warning("Building the CPU kernels failed (%s: %s); the engine uses the slower "
                       "torch path", type(exc).__name__,
                       str(exc).splitlines()[0] if str(exc) else "")
        return None


def kernel_build(level: BuildLevel, compiler: str = "c++") -> ExtensionBuild:
    """The build of this package's kernels at `level`, in the user cache
    (OFFICELLM_CACHE_DIR overrides)."""
    return ExtensionBuild(prefix="officellm_cpu_kernels", sources=SOURCES,
                          cflags=(*CFLAGS, *level.isa_flags), ldflags=("-fopenmp",),
                          cache_dir=_cache_root() / "cpu_kernels", compiler=compiler,
                          headers=HEADERS)


def _cache_root() -> Path:
    configured = os.environ.get("OFFICELLM_CACHE_DIR")
    if configured:
        return Path(configured)
    # Imported here: a GPU machine never builds these kernels and may lack platformdirs.
    import platformdirs

    return Path(platformdirs.user_cache_dir("officellm"))
