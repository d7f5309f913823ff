"""`officellm admin`: the Qt admin console (admin_ui/)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("admin", help="open the admin console (PySide6)",
                       description="Start/stop the local server, watch KV usage, preemptions "
                                   "and thread lengths, manage users, keys and policies.")
    p.add_argument("--url", default=None,
                   help="watch the server at this URL instead of managing the local one")
    p.add_argument("--token-file", default=None,
                   help="read the admin token from this file (default: admin_token in the "
                        "server's data dir)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from officellm.admin_ui.app import main  # Qt is imported only when the console is opened

    return main(url=args.url, token_file=args.token_file)
