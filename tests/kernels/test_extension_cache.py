"""The C++ extension build cache (kernels/build/extension_cache.py): killed builds, sharing, keys.

A tiny extension (Python's C API only, so it compiles in a second) goes through the same
cache as the real kernels; the compiler is a wrapper around c++ that logs each compilation
and, when told, stalls in it so a build can be killed midway.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from officellm.kernels.build.extension_cache import ExtensionBuild, SourceFile, compiler_target

ANSWER_SOURCE = textwrap.dedent("""\
    #include <Python.h>
    #define CAT2(a, b) a##b
    #define CAT(a, b) CAT2(a, b)
    #define STR2(x) #x
    #define STR(x) STR2(x)
    static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(42); }
    static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {nullptr, nullptr, 0, nullptr}};
    static PyModuleDef module = {PyModuleDef_HEAD_INIT, STR(TORCH_EXTENSION_NAME), "", -1, methods};
    PyMODINIT_FUNC CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&module); }
""")

WRAPPER = textwrap.dedent("""\
    #!/bin/sh
    case " $* " in
      *" -c "*)
        echo compile >> "$COMPILE_LOG"
        if [ -n "$STALL_MARKER" ]; then touch "$STALL_MARKER"; sleep "${STALL_S:-300}"; fi ;;
    esac
    exec c++ "$@"
""")

LOAD_SCRIPT = textwrap.dedent("""\
    import sys
    from pathlib import Path
    from officellm.kernels.build.extension_cache import ExtensionBuild, SourceFile
    cache, source, compiler = sys.argv[1:4]
    build = ExtensionBuild(prefix="answer", sources=(SourceFile(Path(source)),), cflags=("-O1",),
                           ldflags=(), cache_dir=Path(cache), compiler=compiler)
    print(build.load().answer())
""")


@pytest.fixture
def setup(tmp_path: Path):
    """The tiny extension's source, the logging compiler wrapper and an empty cache."""
    source = tmp_path / "answer.cpp"
    source.write_text(ANSWER_SOURCE)
    wrapper = tmp_path / "logging-c++"
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)
    log = tmp_path / "compile.log"
    log.touch()
    return tmp_path / "cache", source, wrapper, log


def _start(setup, **env: str) -> subprocess.Popen[str]:
    cache, source, wrapper, log = setup
    environment = {**os.environ, "CXX": str(wrapper), "COMPILE_LOG": str(log), **env}
    return subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT, str(cache), str(source),
                             str(wrapper)], env=environment, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _answer(process: subprocess.Popen[str], timeout: float = 180) -> str:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"loading the extension did not finish within {timeout} s (a stuck lock?)")
    assert process.returncode == 0, out
    return out.strip().splitlines()[-1]


def _wait_for(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def _compilations(log: Path) -> int:
    return len(log.read_text().split())


def test_a_build_killed_midway_is_redone_by_the_next_load(setup):
    cache, _, _, log = setup
    marker = cache.parent / "stalled"
    builder = _start(setup, STALL_MARKER=str(marker))
    _wait_for(marker)  # the builder holds the lock and is inside the compiler
    os.killpg(builder.pid, signal.SIGKILL)
    builder.wait()

    assert _answer(_start(setup)) == "42"
    assert _compilations(log) == 2  # the killed compilation, then the redone one
    assert not list(cache.glob(".build-*")), "the killed build's private directory is left"


def test_a_built_extension_loads_without_invoking_the_compiler(setup):
    _, _, _, log = setup
    assert _answer(_start(setup)) == "42"
    assert _compilations(log) == 1

    assert _answer(_start(setup)) == "42"
    assert _compilations(log) == 1


def test_a_load_during_a_build_waits_for_it_and_shares_its_result(setup):
    cache, _, _, log = setup
    marker = cache.parent / "stalled"
    builder = _start(setup, STALL_MARKER=str(marker), STALL_S="3")
    _wait_for(marker)
    waiter = _start(setup)

    assert _answer(builder) == "42"
    assert _answer(waiter) == "42"
    assert _compilations(log) == 1


def _build(source: Path, cache: Path, cflags: tuple[str, ...]) -> ExtensionBuild:
    return ExtensionBuild(prefix="answer", sources=(SourceFile(source),), cflags=cflags, ldflags=(),
                          cache_dir=cache)


def test_the_key_is_stable_and_changes_with_flags_and_sources(setup):
    cache, source, _, _ = setup
    key = _build(source, cache, ("-O1",)).key()
    assert _build(source, cache, ("-O1",)).key() == key
    assert _build(source, cache, ("-O2",)).key() != key
    source.write_text(ANSWER_SOURCE + "// changed\n")
    assert _build(source, cache, ("-O1",)).key() != key


def test_the_key_changes_with_a_files_own_flags_and_the_headers(setup):
    cache, source, _, _ = setup
    header = source.with_name("answer.h")
    header.write_text("// a header\n")

    def build(own: tuple[str, ...]) -> ExtensionBuild:
        return ExtensionBuild(prefix="answer", sources=(SourceFile(source, own),), cflags=("-O1",),
                              ldflags=(), cache_dir=cache, headers=(header,))

    key = build(()).key()
    assert build(("-ffast-math",)).key() != key
    header.write_text("// a header, changed\n")
    assert build(()).key() != key


def test_the_key_spells_out_what_march_native_means_on_this_cpu():
    # A cache copied to a machine with other CPU features must not be loaded there.
    native = compiler_target("c++", ("-march=native",))
    baseline = compiler_target("c++", ("-march=x86-64",))
    assert native != baseline
    assert "-march=native" not in native.split()
