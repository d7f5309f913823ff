"""A ninja build of one shared library whose sources each have compiler flags of their own."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

OUTPUT_TAIL_CHARS = 4000  # of the compiler's messages, in the error a failed build raises


def _escape(path: Path | str) -> str:
    """A path as a ninja build line names it ($, space and colon are special there)."""
    return str(path).replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


@dataclass(frozen=True)
class NinjaBuild:
    """Compile each source with common_cflags and then its own flags, link into `output`."""

    compiler: str
    common_cflags: tuple[str, ...]
    ldflags: tuple[str, ...]
    output: Path
    sources: tuple[tuple[Path, tuple[str, ...]], ...]  # (file, its own flags)

    def text(self) -> str:
        """The build.ninja that builds `output` (objects beside it)."""
        lines = ["ninja_required_version = 1.3",
                 f"cxx = {self.compiler}",
                 "rule compile",
                 "  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out",
                 "  depfile = $out.d",
                 "  deps = gcc",
                 "rule link",
                 "  command = $cxx $in $ldflags -o $out"]
        objects = []
        for index, (source, own) in enumerate(self.sources):
            obj = self.output.parent / f"{index}_{source.stem}.o"
            objects.append(_escape(obj))
            flags = shlex.join([*self.common_cflags, *own])
            lines += [f"build {_escape(obj)}: compile {_escape(source.resolve())}",
                      f"  cflags = {flags}"]
        lines += [f"build {_escape(self.output)}: link {' '.join(objects)}",
                  f"  ldflags = {shlex.join(self.ldflags)}",
                  f"default {_escape(self.output)}"]
        return "\n".join(lines) + "\n"

    def run(self, directory: Path) -> None:
        """Write build.ninja into `directory` and build; RuntimeError with the compiler's
        messages when it fails."""
        (directory / "build.ninja").write_text(self.text())
        # The `ninja` wheel puts its binary beside this interpreter, which is not on PATH when
        # it runs as .venv/bin/python without an activated environment.
        ninja = shutil.which("ninja") or str(Path(sys.executable).with_name("ninja"))
        done = subprocess.run([ninja, "-C", str(directory)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"building {self.output.name} failed:\n"
                               f"{(done.stdout + done.stderr)[-OUTPUT_TAIL_CHARS:]}")
