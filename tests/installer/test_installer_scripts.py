"""Fast checks of the installer scripts and CI entry point (no pip, no network)."""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

import pytest

from tests.installer.installer_helpers import INSTALLER, REPO_ROOT, run

README = REPO_ROOT / "README.md"
CI_RUN = REPO_ROOT / ".ci" / "run"
SCRIPTS = [INSTALLER / n for n in ("install.sh", "uninstall.sh", "build_bundle.sh", "paths.sh")]
MARK = "# Written by officellm's installer/install.sh"


def readme_commands() -> list[str]:
    """The command lines in README's fenced shell blocks."""
    lines = []
    for block in re.findall(r"```(?:sh|bash|shell)\n(.*?)```", README.read_text(), re.S):
        lines += [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]
    return lines


def test_readme_shows_the_two_commands_first():
    commands = readme_commands()
    install = "./installer/install.sh --dev && .venv/bin/officellm serve"
    tests = "./installer/install.sh --dev && .venv/bin/python -m pytest"
    assert install in commands and tests in commands
    # "Top first": they are the first two commands a reader meets.
    assert commands[:2] == [install, tests]


def test_ci_runs_the_readme_test_command_verbatim():
    [readme_test_cmd] = [c for c in readme_commands() if c.endswith("-m pytest")][:1]
    ci_lines = [ln.strip() for ln in CI_RUN.read_text().splitlines()]
    # As a command (not inside a comment), with no arguments added: after it comes only the
    # end of the line or a shell operator such as `|| rc=$?`.
    exact = re.compile(re.escape(readme_test_cmd) + r"\s*($|\|\||&&|;)")
    assert any(exact.match(ln) for ln in ci_lines if not ln.startswith("#")), (
        f".ci/run must run the README's test command {readme_test_cmd!r} verbatim"
    )


@pytest.mark.parametrize("script", [*SCRIPTS, CI_RUN], ids=lambda p: p.name)
def test_scripts_are_valid_bash(script: Path):
    assert run(["bash", "-n", str(script)], env=dict(os.environ)).returncode == 0
    if script.name != "paths.sh":  # sourced, not run
        assert script.stat().st_mode & stat.S_IXUSR, f"{script} is not executable"


def test_install_options_are_checked():
    env = dict(os.environ)
    help_ = run([str(INSTALLER / "install.sh"), "--help"], env)
    assert help_.returncode == 0 and "--prefix" in help_.stdout and "--dev" in help_.stdout
    assert run([str(INSTALLER / "install.sh"), "--frobnicate"], env).returncode == 2
    # --dev is the repo's .venv only; mixing it with a per-user install is a mistake.
    mixed = run([str(INSTALLER / "install.sh"), "--dev", "--prefix", "/tmp/x"], env)
    assert mixed.returncode == 2 and "--dev" in mixed.stderr
    assert run([str(INSTALLER / "uninstall.sh"), "--bogus"], env).returncode == 2


def _fake_ci_tree(tmp_path: Path) -> Path:
    """A copy of .ci/run next to stand-ins for install.sh and .venv/bin/python, which record
    their arguments and exit with FAKE_RUFF_RC for `-m ruff`, FAKE_PYTEST_RC otherwise."""
    root = tmp_path / "repo"
    (root / ".ci").mkdir(parents=True)
    shutil.copy(CI_RUN, root / ".ci" / "run")
    (root / "installer").mkdir()
    (root / ".venv" / "bin").mkdir(parents=True)
    fakes = {
        root / "installer" / "install.sh": 'echo "install $*" >> "$LOG"\n',
        root / ".venv" / "bin" / "python": 'echo "python $* QT=$QT_QPA_PLATFORM" >> "$LOG"\n'
        '[ "$2" = ruff ] && exit "$FAKE_RUFF_RC"\n'
        'exit "$FAKE_PYTEST_RC"\n',
    }
    for path, body in fakes.items():
        path.write_text("#!/usr/bin/env bash\n" + body)
        path.chmod(0o755)
    return root


@pytest.mark.parametrize("pytest_rc, ruff_rc, want_failure", [
    (0, 0, False), (1, 0, True), (5, 0, True), (0, 1, True),
], ids=["green", "a-test-fails", "no-tests", "lint-fails"])
def test_ci_run_exit_status(tmp_path: Path, pytest_rc: int, ruff_rc: int, want_failure: bool):
    root = _fake_ci_tree(tmp_path)
    log = tmp_path / "calls.log"
    env = dict(os.environ, LOG=str(log), FAKE_PYTEST_RC=str(pytest_rc),
               FAKE_RUFF_RC=str(ruff_rc), CI="true")
    result = run([str(root / ".ci" / "run")], env, cwd=tmp_path)
    assert (result.returncode != 0) == want_failure, result.stdout + result.stderr
    assert log.read_text().splitlines() == ["install --dev", "python -m pytest QT=offscreen",
                                            "python -m ruff check . QT=offscreen"]
    assert "install + tests + lint took" in result.stdout  # the timing line
    if pytest_rc == 5:
        assert "no tests" in result.stderr


def _fake_install(env: dict[str, str], prefix: Path) -> dict[str, Path]:
    """Lay out what install.sh --prefix PREFIX would leave, without pip."""
    data_home = Path(env["XDG_DATA_HOME"])
    paths = {
        "venv": prefix / "venv",
        "launcher": prefix / "bin" / "officellm",
        "desktop": data_home / "applications" / "officellm-admin.desktop",
        "unit": Path(env["XDG_CONFIG_HOME"]) / "systemd/user/officellm.service",
        "db": data_home / "officellm" / "officellm.db",
        "cache": Path(env["XDG_CACHE_HOME"]) / "officellm" / "weights.safetensors",
    }
    for p in paths.values():
        p.parent.mkdir(parents=True, exist_ok=True)
    paths["venv"].mkdir()
    (paths["venv"] / "pyvenv.cfg").write_text("home = /usr/bin\n")
    launcher = str(paths["launcher"])
    paths["launcher"].write_text(f"#!/bin/sh\n{MARK}\nexec {prefix}/venv/bin/officellm \"$@\"\n")
    paths["desktop"].write_text(f"[Desktop Entry]\n{MARK}\nExec=\"{launcher}\" admin\n")
    paths["unit"].write_text(f"{MARK}\n[Service]\nExecStart=\"{launcher}\" serve\n")
    paths["db"].write_text("the office's users and keys")
    paths["cache"].write_text("weights")
    return paths


def test_uninstall_keeps_data_unless_purge(sandbox_env: dict[str, str], tmp_path: Path):
    prefix = tmp_path / "prefix"
    paths = _fake_install(sandbox_env, prefix)
    uninstall = [str(INSTALLER / "uninstall.sh"), "--prefix", str(prefix)]

    result = run(uninstall, sandbox_env)
    assert result.returncode == 0, result.stderr
    for name in ("venv", "launcher", "desktop", "unit"):
        assert not paths[name].exists(), f"{name} left behind"
    assert not prefix.exists(), "the emptied prefix should be tidied away"
    assert paths["db"].read_text() == "the office's users and keys"
    assert paths["cache"].exists()

    result = run([*uninstall, "--purge"], sandbox_env)
    assert result.returncode == 0, result.stderr
    assert not paths["db"].parent.exists() and not paths["cache"].parent.exists()


def test_uninstall_leaves_files_that_are_not_ours(sandbox_env: dict[str, str], tmp_path: Path):
    prefix = tmp_path / "prefix"
    paths = _fake_install(sandbox_env, prefix)
    # Someone else's `officellm` script, and a desktop entry from an install in another prefix.
    paths["launcher"].write_text("#!/bin/sh\necho not ours\n")
    paths["desktop"].write_text(f"[Desktop Entry]\n{MARK}\nExec=\"/elsewhere/bin/officellm\" admin\n")
    (paths["venv"] / "pyvenv.cfg").unlink()  # not a venv: never rm -rf it

    result = run([str(INSTALLER / "uninstall.sh"), "--prefix", str(prefix)], sandbox_env)
    assert result.returncode == 0, result.stderr
    assert paths["launcher"].read_text().endswith("not ours\n")
    assert paths["desktop"].exists()
    assert paths["venv"].is_dir() and "left alone" in result.stderr
    assert not paths["unit"].exists()  # that one pointed at this prefix's launcher


def _fake_system(tmp_path: Path, uid: int, missing: set[str], lists: bool) -> dict[str, str]:
    """Stand-ins for dpkg-query, apt-cache, apt-get, id and python on PATH: `missing` are the
    packages not installed; apt knows candidates once it has package lists (`lists`, or after
    `apt-get update`). apt-get only logs. The fake python passes the version check and then
    fails to make a venv, which stops install.sh right after its system-package step."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    if lists:
        (state / "lists").touch()
    scripts = {
        "dpkg-query": f'for p in {" ".join(sorted(missing))}; do '
        '[ "${@: -1}" = "$p" ] && { echo not-installed; exit 0; }; done; echo installed\n',
        # Debian 12: there is no libglib2.0-0t64.
        "apt-cache": f'[ -e {state}/lists ] && [ "$2" != libglib2.0-0t64 ] '
        '&& echo "  Candidate: 1.0" || echo "  Candidate: (none)"\n',
        "apt-get": f'echo "apt-get $*" >> {state}/apt.log\n'
        f'[ "$1" = update ] && touch {state}/lists\nexit 0\n',
        "id": f"echo {uid}\n",
        "python3": '[ "$1" = -m ] && exit 1; exit 0\n',
    }
    for name, body in scripts.items():
        (fake / name).write_text("#!/usr/bin/env bash\n" + body)
        (fake / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", OFFICELLM_PYTHON="python3")
    env.pop("DISPLAY", None)
    return env


def _apt_calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "state" / "apt.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("lists", [True, False], ids=["lists", "fresh-container"])
def test_install_as_root_apt_installs_missing_qt_libs(tmp_path: Path, lists: bool):
    env = _fake_system(tmp_path, 0, {"libegl1", "libglib2.0-0", "libglib2.0-0t64"}, lists)
    result = run([str(INSTALLER / "install.sh"), "--prefix", str(tmp_path / "p")], env)
    assert "could not create a venv" in result.stderr  # got past the apt step
    want = ["apt-get install -y -q --no-install-recommends libegl1 libglib2.0-0"]
    # apt-get update only when apt knows no candidate (no package lists yet).
    assert _apt_calls(tmp_path) == (want if lists else ["apt-get update -q", *want])


def test_install_as_root_needs_no_apt_when_nothing_is_missing(tmp_path: Path):
    env = _fake_system(tmp_path, 0, set(), lists=True)
    run([str(INSTALLER / "install.sh"), "--prefix", str(tmp_path / "p")], env)
    assert _apt_calls(tmp_path) == []


def test_install_as_user_prints_the_apt_command(tmp_path: Path):
    env = _fake_system(tmp_path, 1000, {"libegl1", "libxkbcommon0"}, lists=True)
    result = run([str(INSTALLER / "install.sh"), "--prefix", str(tmp_path / "p")], env)
    assert _apt_calls(tmp_path) == []
    assert "sudo apt-get install libegl1 libxkbcommon0" in result.stderr
