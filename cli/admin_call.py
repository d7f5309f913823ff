"""Asking the running server's admin API from the command line: its address and admin token
as arguments, one call, the server's error said in one line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from officellm.app.db.database import Database
from officellm.cli.actor import CLIENT_HEADER, cli_actor
from officellm.cli.db import add_db_argument, database_target

DEFAULT_URL = "http://127.0.0.1:8000"


class NoServer(ConnectionError):
    """No server answers at the address."""


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    """--url, --token-file and the database (whose admin token is used by default)."""
    p.add_argument("--url", default=DEFAULT_URL,
                   help=f"the server's address (default {DEFAULT_URL})")
    p.add_argument("--token-file", type=Path, default=None,
                   help="the admin token's file (default: admin_token beside the database)")
    add_db_argument(p, help_suffix="; its admin token is used")


def admin_token(args: argparse.Namespace) -> str:
    path = args.token_file
    if path is None:
        db = Database(database_target(args))
        path = db.admin_token_path
        db.close()
    try:
        return Path(path).read_text().strip()
    except FileNotFoundError:
        raise FileNotFoundError(f"No admin token at {path}; give --token-file (the server "
                                f"writes it at its first start).") from None


def admin_call(args: argparse.Namespace, path: str, method: str = "POST") -> Any:
    """Call the admin API at `path` (under /admin); the httpx response. NoServer when
    nothing answers."""
    import httpx

    token = admin_token(args)
    url = f"{args.url.rstrip('/')}/admin/{path}"
    try:
        # No read timeout: loading a large model takes as long as it takes.
        headers = {"Authorization": f"Bearer {token}", CLIENT_HEADER: cli_actor()}
        return httpx.request(method, url, headers=headers,
                             timeout=httpx.Timeout(10.0, read=None))
    except httpx.TransportError as exc:
        raise NoServer(f"no server answers at {args.url} ({exc}); is it running "
                       "(officellm serve)?") from exc


def error_message(r: Any) -> str:
    """The message of the server's OpenAI-shaped error, else the body as text."""
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text.strip() or r.reason_phrase


def report_failure(command: str, r: Any) -> int:
    print(f"officellm {command}: the server answered {r.status_code}: {error_message(r)}",
          file=sys.stderr)
    return 1
