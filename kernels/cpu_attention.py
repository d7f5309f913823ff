"""The CPU's paged decode attention (kernels/cpu_decode_attention.cpp), built on first use.

torch.utils.cpp_extension compiles it once per machine (-O3 -march=native: it runs where it
was built) and caches the build under the torch extensions directory, so later starts load it
in well under a second. Where no C++ compiler is installed, `load()` returns None, says why in
one WARNING, and the engine keeps the gather + SDPA path.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

logger = logging.getLogger("officellm.kernels")

SOURCE = Path(__file__).with_name("cpu_decode_attention.cpp")
DISABLE_ENV = "OFFICELLM_NO_CPU_KERNELS"

_lock = threading.Lock()
_state: dict[str, Any] = {}


def load() -> Any | None:
    """The compiled module (with `paged_decode_attention`), or None when it cannot be built."""
    with _lock:
        if "module" not in _state:
            _state["module"] = _build()
        return _state["module"]


def _build() -> Any | None:
    if os.environ.get(DISABLE_ENV):
        logger.info("CPU attention kernel disabled by %s; using gather + SDPA", DISABLE_ENV)
        return None
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        logger.warning("No C++ compiler (%s) found: the CPU attention kernel is not built and "
                       "decode attention uses the slower gather + SDPA path", compiler)
        return None
    # The `ninja` wheel puts its binary beside this interpreter, which is not on PATH when
    # the server runs as .venv/bin/python without an activated environment.
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    logger.info("Loading the CPU attention kernel (built once per machine, ~30 s the first time)")
    try:
        from torch.utils import cpp_extension

        return cpp_extension.load(
            name="officellm_cpu_decode_attention",
            sources=[str(SOURCE)],
            extra_cflags=["-O3", "-march=native", "-fopenmp", "-ffast-math"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as exc:  # a broken toolchain must not stop the server
        logger.warning("Building the CPU attention kernel failed (%s: %s); decode attention "
                       "uses the slower gather + SDPA path", type(exc).__name__,
                       str(exc).splitlines()[0] if str(exc) else "")
        return None
