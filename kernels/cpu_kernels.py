"""The CPU's C++ kernels, built on first use: paged decode attention
(cpu_decode_attention.cpp) and the fused per-layer ops (cpu_fused_ops.cpp).

torch.utils.cpp_extension compiles it once per machine (-O3 -march=native: it runs where it
was built) into a directory of the user cache named by a hash of the sources and flags, from a
copy of the sources kept there: every install of the same sources (a checkout, the installed
package) shares one build, and later starts load it in well under a second. Where no C++ compiler is installed, `load()` returns None, says why in
one WARNING, and the engine keeps the torch reference path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import platformdirs

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
        from torch.utils import cpp_extension

        build_dir, sources = _build_tree()
        return cpp_extension.load(
            name=f"officellm_cpu_kernels_{build_dir.name}",
            sources=[str(p) for p in sources],
            build_directory=str(build_dir),
            extra_cflags=CFLAGS,
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as exc:  # a broken toolchain must not stop the server
        logger.warning("Building the CPU kernels failed (%s: %s); the engine uses the slower "
                       "torch path", type(exc).__name__,
                       str(exc).splitlines()[0] if str(exc) else "")
        return None


def _build_tree() -> tuple[Path, list[Path]]:
    """The build directory for these sources, flags and torch, with the sources copied in."""
    import torch

    digest = hashlib.sha256()
    for part in [torch.__version__, *CFLAGS] + [p.read_bytes() for p in SOURCES]:
        digest.update(part if isinstance(part, bytes) else part.encode())
    root = Path(os.environ.get("OFFICELLM_CACHE_DIR") or platformdirs.user_cache_dir("officellm"))
    build_dir = root / "cpu_kernels" / digest.hexdigest()[:16]
    (build_dir / "src").mkdir(parents=True, exist_ok=True)
    copies = []
    for source in SOURCES:
        copy = build_dir / "src" / source.name
        if not copy.exists():  # written whole, then renamed: another process may be reading
            tmp = copy.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(source.read_bytes())
            tmp.replace(copy)
        copies.append(copy)
    return build_dir, copies
