"""The `officellm` command works with only the core dependencies installed: the console's Qt and
the benchmarks' matplotlib are extras, imported only by the subcommands that use them."""

from __future__ import annotations

import subprocess
import sys

BLOCK_EXTRAS = """
import builtins, sys
real = builtins.__import__
def guarded(name, *args, **kwargs):
    if name.split(".")[0] in ("matplotlib", "PySide6", "pyqtgraph", "triton"):
        raise ImportError(f"{name} is an extra and is not installed here")
    return real(name, *args, **kwargs)
builtins.__import__ = guarded
from officellm.cli import main
"""
RUN = BLOCK_EXTRAS + "main(sys.argv[1:])\n"
# Every subcommand's --help in one interpreter: a fresh one per subcommand costs an import
# of torch each.
EACH_HELP = BLOCK_EXTRAS + """
for command in sys.argv[1:]:
    try:
        main([command, "--help"])
    except SystemExit as exit:
        if exit.code not in (0, None):
            sys.exit(f"{command}: exit {exit.code}")
"""


def _officellm(*args: str, script: str = RUN) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *args],
                          capture_output=True, text=True, timeout=120)


def test_plan_runs_without_the_extras():
    out = _officellm("plan", "Qwen2.5-7B-Instruct")
    assert out.returncode == 0, out.stderr
    assert "57,344" in out.stdout


def test_every_subcommand_parses_its_help_without_the_extras():
    commands = ("serve", "admin", "bench", "users", "keys", "policy", "db", "plan", "audit")
    out = _officellm(*commands, script=EACH_HELP)
    assert out.returncode == 0, out.stderr
    for command in commands:
        assert f"usage: officellm {command}" in out.stdout, command
