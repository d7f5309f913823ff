"""A per-machine cache of C++ extension builds that a killed build cannot wedge, each source
compiled with flags of its own.

torch.utils.cpp_extension alone builds in a shared directory under a lock *file*: a build
killed midway (SIGTERM at start-up, a CI timeout) leaves the file behind and every later load,
of any install, waits for it forever. Its build directory is also keyed by name only, and each
install writes its own build.ninja (its own include paths), so two installs rebuild each
other's kernels. Here instead:

- the key is everything the binary depends on: the sources, the compiler flags, what the
  compiler makes of them on this CPU (`-march=native` spelled out: a cache copied to another
  machine is not loaded there), the compiler's version, torch's version and the Python ABI;
- the lock is an OS file lock (flock), released by the kernel when its holder dies, so a
  killed build is simply redone by the next process;
- a build happens in a private directory and only its result, one shared object, is moved
  into place with one rename: a reader sees the whole file or none, and every install with
  the same key loads it without invoking the compiler.

The build itself is a ninja file written here rather than torch.utils.cpp_extension.load,
whose flags are the same for every source: here a file gets flags of its own (the quantized
matmul must not get -ffast-math, the attention kernels want it). The flags torch's loader
would add (its include paths and libraries, the extension's name) are added here too.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import logging
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from officellm.kernels.build.ninja_file import NinjaBuild

logger = logging.getLogger("officellm.kernels")

PROBE_TIMEOUT_S = 30
# Which of the compiler's expanded arguments say what code it emits (gcc: -march=znver3
# -mavx2 -mno-avx512er ...; clang: -target-cpu znver3 -target-feature +avx2 ...).
_CLANG_TARGET_ARGS = ("-target-cpu", "-tune-cpu", "-target-feature")


def compiler_target(compiler: str, cflags: tuple[str, ...]) -> str:
    """The compiler's version and the target it resolves `cflags` to on this machine.

    `c++ -###` prints the commands it would run with `-march=native` expanded into the CPU's
    features; only those arguments and the version line are kept (the rest names temporary
    files that differ from call to call).
    """
    probe = subprocess.run([compiler, *cflags, "-###", "-E", "-x", "c++", os.devnull],
                           capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=True)
    kept: list[str] = []
    for line in probe.stderr.splitlines():
        if " version " in line:
            kept.append(line.strip())
        elif line.startswith((" ", '"')):
            tokens = shlex.split(line)
            for before, token in zip(["", *tokens], tokens):
                if token.startswith("-m") or before in _CLANG_TARGET_ARGS:
                    kept.append(token)
    return "\n".join(kept)


@dataclass(frozen=True)
class SourceFile:
    """One C++ file of an extension and the flags it alone is compiled with (after the
    build's own)."""

    path: Path
    cflags: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExtensionBuild:
    """One C++ extension module, built once per key under `cache_dir`."""

    prefix: str  # the module's name is prefix_<key>: a Python identifier
    sources: tuple[SourceFile, ...]
    cflags: tuple[str, ...]  # every source's
    ldflags: tuple[str, ...]
    cache_dir: Path
    compiler: str = "c++"
    headers: tuple[Path, ...] = ()  # what the sources include: part of the key

    def key(self) -> str:
        """16 hex digits naming everything the built binary depends on."""
        import torch

        digest = hashlib.sha256()
        parts = [torch.__version__, sys.implementation.cache_tag,
                 str(sysconfig.get_config_var("EXT_SUFFIX")), *self.cflags, "|",
                 *self.ldflags, "|", compiler_target(self.compiler, self.cflags)]
        for part in parts:
            digest.update(part.encode() + b"\0")
        for source in self.sources:
            digest.update(source.path.name.encode() + b"\0" + source.path.read_bytes() + b"\0")
            for flag in source.cflags:
                digest.update(flag.encode() + b"\0")
        for header in self.headers:
            digest.update(header.name.encode() + b"\0" + header.read_bytes() + b"\0")
        return digest.hexdigest()[:16]

    def load(self) -> ModuleType:
        """The built module: loaded from the cache, or built first (once per machine)."""
        import torch  # noqa: F401 - the module links against the libraries torch loads

        key = self.key()
        name = f"{self.prefix}_{key}"
        artifact = self.cache_dir / f"{name}.so"
        if artifact.exists():
            return _import(name, artifact)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with _exclusive(self.cache_dir / f"{name}.lock"):
            if artifact.exists():  # built by the process we waited for
                return _import(name, artifact)
            self._remove_abandoned_builds(key)
            return self._build(name, key, artifact)

    def _build(self, name: str, key: str, artifact: Path) -> ModuleType:
        private = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=self.cache_dir))
        try:
            built = private / f"{name}.so"
            ninja = NinjaBuild(compiler=self.compiler, common_cflags=(*_torch_cflags(name), *self.cflags),
                               ldflags=(*self.ldflags, *_torch_ldflags()), output=built,
                               sources=tuple((s.path, s.cflags) for s in self.sources))
            ninja.run(private)
            os.replace(built, artifact)
            return _import(name, artifact)
        finally:
            shutil.rmtree(private, ignore_errors=True)

    def _remove_abandoned_builds(self, key: str) -> None:
        """Private build directories left by killed builds (we hold the lock: none is live)."""
        for stale in self.cache_dir.glob(f".build-{key}-*"):
            shutil.rmtree(stale, ignore_errors=True)


def _torch_cflags(name: str) -> tuple[str, ...]:
    """What torch's extension loader compiles every source with: the module's name, torch's
    and Python's headers, its C++ standard and library ABI, position-independent code."""
    import torch
    from torch.utils import cpp_extension

    includes = [*cpp_extension.include_paths(), sysconfig.get_path("include", scheme="posix_prefix")]
    return (f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            *(f"-isystem{path}" for path in includes), "-fPIC", "-std=c++20")


def _torch_ldflags() -> tuple[str, ...]:
    """What torch's extension loader links a module with: torch's libraries."""
    from torch.utils import cpp_extension

    return ("-shared", *(f"-L{path}" for path in cpp_extension.library_paths()),
            "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python")


def _import(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an OS lock on `lock_path`: it dies with this process, whatever way it ends."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("Another process is building the CPU kernels; waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
