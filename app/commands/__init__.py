"""Subcommands of the `officellm` command, one module each, each with register(subparsers)."""
