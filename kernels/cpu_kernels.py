"""The CPU's C++ kernels, built on first use: paged decode attention
(cpu_decode_attention.cpp) and the fused per-layer ops (cpu_fused_ops.cpp).

They are compiled once per machine (-O3 -march=native: the binary runs where it was built)
into the user cache by kernels/extension_cache.py, which keys the build by everything it
depends on and survives a build killed midway; later starts, of any install with the same
key, load it in well under a second. Where no C++ compiler is installed, `load()` returns
None, says why in one WARNING, and the engine keeps the torch reference path.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import platformdirs

from kernels.extension_cache import ExtensionBuild

logger = logging.getLogger("officellm.kernels")

SOURCES = [Path(__file__).with_name(name) for name in
           ("cpu_decode_attention.cpp", "cpu_fused_ops.cpp", "cpu_bindings.cpp")]
DISABLE_ENV = "OFFICELLM_NO_CPU_KERNELS"

# -ffp-contract=off: a*b + c*d as torch computes it (no fused multiply-add), so the fused
# ops round exactly where the references do.
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math", "-ffp-contract=off"]

_lock = threading.Lock()
_state: dict[str, Any] = {}


def load() -> Any | None:
    """The compiled module, or None when it cannot be built."""
    with _lock:
        if "module" not in _state:
            _state["module"] = _build()
        return _state["module"]


def _build() -> Any | None:
    if os.environ.get(DISABLE_ENV):
        logger.info("CPU kernels disabled by %s; using the torch path", DISABLE_ENV)
        return None
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        logger.warning("No C++ compiler (%s) found: the CPU kernels are not built and the "
                       "engine uses the slower torch path", compiler)
        return None
    # The `ninja` wheel puts its binary beside this interpreter, which is not on PATH when
    # the server runs as .venv/bin/python without an activated environment.
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    logger.info("Loading the CPU kernels (built once per machine, ~1 min the first time)")
    try:
        return kernel_build(compiler).load()
    except Exception as exc:  # a broken toolchain must not stop the server
        logger.warning("Building the CPU kernels failed (%s: %s); the engine uses the slower "
                       "torch path", type(exc).__name__,
                       str(exc).splitlines()[0] if str(exc) else "")
        return None


def kernel_build(compiler: str = "c++") -> ExtensionBuild:
    """The build of this package's kernels, in the user cache (OFFICELLM_CACHE_DIR overrides)."""
    root = Path(os.environ.get("OFFICELLM_CACHE_DIR") or platformdirs.user_cache_dir("officellm"))
    return ExtensionBuild(prefix="officellm_cpu_kernels", sources=tuple(SOURCES),
                          cflags=tuple(CFLAGS), ldflags=("-fopenmp",),
                          cache_dir=root / "cpu_kernels", compiler=compiler)
