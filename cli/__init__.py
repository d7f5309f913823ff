"""The `officellm` command: one entry point (`officellm.cli:main`, also `python -m officellm.cli`), each
subcommand a module of this package with register(subparsers).

The CLI sits on top: it may import the app, admin_ui and loadgen, and nothing imports it back
(tests/architecture/test_app_layers.py)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Each module has register(subparsers); add new subcommands here.
COMMAND_MODULES = [
    "officellm.cli.plan",
    "officellm.cli.serve",
    "officellm.cli.db",
    "officellm.cli.users",
    "officellm.cli.keys",
    "officellm.cli.policy",
    "officellm.cli.usage",
    "officellm.cli.models",
    "officellm.cli.admin",
    "officellm.cli.bench",
    "officellm.cli.cluster",
    "officellm.cli.audit",
]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of `command`'s alone (each module registers the
    subcommand of its own name)."""
    parser = argparse.ArgumentParser(prog="officellm", description="One LLM shared by an office.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        if command is None or name.rpartition(".")[2] == command:
            importlib.import_module(name).register(sub)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand `argv` names, if it names one: only its module is imported, so
    `officellm keys list` does not wait for `serve`'s imports (torch, ~3 s)."""
    names = {name.rpartition(".")[2] for name in COMMAND_MODULES}
    return argv[0] if argv and argv[0] in names else None


# torch's CPU allocator puts allocations of 2 MB and more on transparent huge pages when this
# is set (read once, at its first allocation: so before torch is imported). A CPU decode step
# streams every weight once; with 4 KB pages its reads miss the TLB every 4 KB, and on 2 MB
# pages the same kernels read 5-10% faster (docs/performance.md). THP_MEM_ALLOC_ENABLE=0
# turns it off.
HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault(HUGE_PAGES_ENV, "1")
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(_command(argv)).parse_args(argv)
    try:
        code = args.func(args)
    except (FileNotFoundError, ValueError) as exc:
        print(f"officellm {args.command}: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code or 0)

