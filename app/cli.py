"""The `officellm` command: one entry point, subcommands in app/commands/."""

from __future__ import annotations

import argparse
import importlib
import sys

# Each module has register(subparsers); add new subcommands here.
COMMAND_MODULES = [
    "app.commands.plan",
    "app.commands.serve",
    "app.commands.db",
    "app.commands.users",
    "app.commands.keys",
    "app.commands.policy",
    "app.commands.admin",
    "app.commands.bench",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="officellm", description="One LLM shared by an office.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except (FileNotFoundError, ValueError) as exc:
        print(f"officellm {args.command}: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code or 0)


if __name__ == "__main__":
    main()
