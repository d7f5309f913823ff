"""`officellm keys issue|list|revoke`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from officellm.app.db import admin_changes
from officellm.app.db.keys import list_keys
from officellm.cli.actor import cli_actor
from officellm.cli.db import add_db_argument, format_time, open_db


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="issue, list, revoke API keys",
                       description="API keys: shown once when issued, stored only as a hash.")
    ksub = p.add_subparsers(dest="keys_command", required=True)
    issue = ksub.add_parser(
        "issue", help="make a key for a user and print it (once)",
        description="Make a key for a user and print it (once). With --forwarded-users it is a "
                    "front-end key (Open WebUI, LibreChat, a proxy): each request it sends is "
                    "for the person it names, who becomes a user of their own.")
    issue.add_argument("user", help="user name or id")
    issue.add_argument("--forwarded-users", action="store_true",
                       help="a front-end key: trusted to say which person each request is for "
                            "(Open WebUI's X-OpenWebUI-User-* headers or the `user` field)")
    issue.add_argument("--jwt-secret-file", type=Path, default=None, metavar="FILE",
                       help="with --forwarded-users: the file holding the HS256 secret the "
                            "front end signs X-OpenWebUI-User-Jwt with (Open WebUI's "
                            "FORWARD_USER_INFO_HEADER_JWT_SECRET); then every request must "
                            "carry a valid one. The secret is copied to a private file beside "
                            "the database; only its fingerprint goes in the database")
    add_db_argument(issue)
    issue.set_defaults(func=run_issue)
    ls = ksub.add_parser("list", help="list keys (prefixes only)")
    ls.add_argument("--user", default=None, help="only this user's keys")
    ls.add_argument("--json", action="store_true")
    add_db_argument(ls)
    ls.set_defaults(func=run_list)
    rev = ksub.add_parser("revoke", help="revoke a key by its id or shown prefix")
    rev.add_argument("key", metavar="PREFIX_OR_ID")
    add_db_argument(rev)
    rev.set_defaults(func=run_revoke)


def _user_ref(value: str) -> int | str:
    return int(value) if value.isdigit() else value


def _read_secret(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"officellm: cannot read the JWT secret file {path}: {exc}") from exc


def run_issue(args: argparse.Namespace) -> int:
    if args.jwt_secret_file is not None and not args.forwarded_users:
        print("officellm: --jwt-secret-file is for a front-end key: add --forwarded-users",
              file=sys.stderr)
        return 2
    secret = _read_secret(args.jwt_secret_file) if args.jwt_secret_file is not None else None
    db = open_db(args)
    try:
        with db.transaction() as s:
            issued = admin_changes.issue_key(
                s, cli_actor(), _user_ref(args.user), forwarded_users=args.forwarded_users,
                jwt_secret=secret, secrets=db.jwt_secrets)
    finally:
        db.close()
    print(issued.raw)
    kind = ""
    if issued.info.forwarded_users:
        kind = (" (front-end key: its people come in signed JWTs)" if issued.info.jwt_secret
                else " (front-end key: it names its people in headers or the user field)")
    print(f"(key {issued.info.id} for {issued.info.user_name}{kind}; shown only now, store it "
          "safely)", flush=True)
    return 0


def run_list(args: argparse.Namespace) -> int:
    db = open_db(args)
    try:
        with db.session() as s:
            keys = list_keys(s, _user_ref(args.user) if args.user else None)
    finally:
        db.close()
    if args.json:
        print(json.dumps([k.to_dict() for k in keys], indent=2))
        return 0
    if not keys:
        print("no keys")
        return 0
    print(f"{'ID':>4}  {'PREFIX':<14} {'USER':<20} {'STATUS':<8} {'KIND':<13} {'CREATED':<21} "
          "LAST USED")
    for k in keys:
        status = "revoked" if k.revoked else "active"
        kind = ("front end+jwt" if k.jwt_secret else "front end") if k.forwarded_users else "user"
        print(f"{k.id:>4}  {k.prefix + '…':<14} {k.user_name:<20} {status:<8} {kind:<13} "
              f"{format_time(k.created):<21} {format_time(k.last_used)}")
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    db = open_db(args)
    try:
        with db.transaction() as s:
            key = admin_changes.revoke_key(s, cli_actor(), args.key, secrets=db.jwt_secrets)
    finally:
        db.close()
    print(f"revoked key {key.id} ({key.prefix}…) of {key.user_name}")
    return 0
