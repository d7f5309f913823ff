"""Helpers for the installer tests (a uniquely named module, importable from every test file)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import platformdirs

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALLER = REPO_ROOT / "installer"


def _real_pip_cache_dir() -> str:
    """pip's cache as the caller sees it, before HOME/XDG_CACHE_HOME are sandboxed away:
    reusing its wheels (and the llama.cpp build) keeps a fresh-venv install at minutes."""
    if os.environ.get("PIP_CACHE_DIR"):
        return os.environ["PIP_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pip")


def _real_officellm_cache_dir() -> str:
    return os.environ.get("OFFICELLM_CACHE_DIR") or platformdirs.user_cache_dir("officellm")


def make_sandbox_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose HOME and XDG dirs live under tmp_path, so an install test writes
    nothing into the real home, and never talks to the real systemd user manager."""
    home = tmp_path / "home"
    env = dict(os.environ)
    env.update(
        HOME=str(home),
        XDG_DATA_HOME=str(home / ".local/share"),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        PIP_CACHE_DIR=_real_pip_cache_dir(),
        # The machine's officellm cache too, as pip's: the CPU kernels are keyed by their
        # sources, flags, compiler, CPU and torch (kernels/build/extension_cache.py), so the
        # install loads the ones this checkout built instead of compiling them again (minutes on
        # two cores); test_extension_cache covers a build. uninstall.sh --purge removes
        # XDG_CACHE_HOME's officellm folder, which stays the sandbox's.
        OFFICELLM_CACHE_DIR=_real_officellm_cache_dir(),
        OFFICELLM_NO_SYSTEMCTL="1",
    )
    for var in ("OFFICELLM_BIN_DIR", "OFFICELLM_DATA_DIR", "DISPLAY"):
        env.pop(var, None)
    # pip's per-user config (e.g. find-links to local torch wheels) lives under the real HOME.
    real_home = Path(os.path.expanduser("~"))
    for rel in (".config/pip/pip.conf", ".pip/pip.conf"):
        if (real_home / rel).is_file():
            (home / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(real_home / rel, home / rel)
    home.mkdir(parents=True, exist_ok=True)
    return env


def run(cmd: list[str], env: dict[str, str], timeout: float = 600, cwd: Path | None = None):
    """Run a command, returning the CompletedProcess with stdout+stderr text."""
    return subprocess.run(
        cmd,
        env=env,
        cwd=cwd or REPO_ROOT,
        timeout=timeout,
        capture_output=True,
        text=True,
    )
