"""Kernel tests: the Triton kernels against kernels.reference.

On a CPU machine they run under Triton's interpreter, which must be switched on before any
kernel is decorated, hence at this module's import. With TRITON_INTERPRET=0 and a GPU they run
compiled on the GPU instead.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

if importlib.util.find_spec("triton") is None:  # the dev extra installs it; say so, skip
    # The C++ CPU kernels (test_cpu_*.py) need no Triton.
    collect_ignore = [p.name for p in Path(__file__).parent.glob("test_*.py")
                      if not p.name.startswith("test_cpu_")]
elif os.environ["TRITON_INTERPRET"] == "1":
    from officellm.kernels.triton.interpreter_compat import patch_scalar_index

    patch_scalar_index()

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
DEVICE = torch.device("cpu" if INTERPRET or not torch.cuda.is_available() else "cuda")

# Interpreter arithmetic on bf16 is not faithful; bf16 is covered on the GPU by gpu_check.sh.
DTYPES = [torch.float32, torch.float16] if DEVICE.type == "cpu" else [
    torch.float32, torch.float16, torch.bfloat16]

TOLERANCE = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3),
             torch.bfloat16: (2e-2, 2e-2)}


def cpu_build_levels() -> list[tuple[str, object]]:
    """(test id, kernels.build.cpu_kernels.BuildLevel): this CPU's own build of the C++ kernels and
    each lower one it can be forced to (OFFICELLM_CPU_ISA), so an AVX-512 machine also tests
    the AVX2 and portable code; a level this CPU lacks is not listed."""
    from officellm.kernels.build import cpu_kernels
    from officellm.kernels.cpu_features import cpu_features

    native = cpu_kernels.build_level()
    levels: list[tuple[str, object]] = [("native", native)]
    for env, name in (("avx2", "avx2"), ("sse41", "x86-64")):
        level = cpu_kernels.build_level(cpu_features({"OFFICELLM_CPU_ISA": env}))
        if level.name == name and level != native:
            levels.append((name, level))
    return levels


# The portable (x86-64, no AVX2) build's tests are in the slow tier (`pytest -m slow`): its
# build alone is ~2 CPU-minutes, and CI (2 cores, 20 minutes) tests this CPU's own build and the
# AVX2 one, the level most office desktops run.
PORTABLE_LEVEL_ID = "x86-64"


@pytest.hookimpl(tryfirst=True)  # before `-m 'not slow'` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks this folder's tests of the portable build `slow`."""
    here = Path(__file__).parent
    for item in items:
        if item.path.parent == here and f"[{PORTABLE_LEVEL_ID}" in item.name:
            item.add_marker(pytest.mark.slow)


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """Assert agreement within the dtype's tolerance (absolute and relative)."""
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)


@pytest.fixture
def device() -> torch.device:
    return DEVICE


@pytest.fixture(scope="session")
def cpu_kernels_module():
    """The compiled CPU kernels (kernels/cpu/), built for this CPU; a failure if they did
    not build."""
    from officellm.kernels.build import cpu_kernels

    module = cpu_kernels.load()
    if module is None:
        pytest.fail("the CPU kernels did not build (is a C++ compiler installed?)")
    return module
