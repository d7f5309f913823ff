"""`officellm keys issue|list|revoke`."""

from __future__ import annotations

import argparse
import json

from app.commands.db import add_db_argument, format_time, open_db
from app.db.keys import issue_key, list_keys, revoke_key


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="issue, list, revoke API keys",
                       description="API keys: shown once when issued, stored only as a hash.")
    ksub = p.add_subparsers(dest="keys_command", required=True)
    issue = ksub.add_parser("issue", help="make a key for a user and print it (once)")
    issue.add_argument("user", help="user name or id")
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


def run_issue(args: argparse.Namespace) -> int:
    db = open_db(args)
    try:
        with db.transaction() as s:
            issued = issue_key(s, _user_ref(args.user))
    finally:
        db.close()
    print(issued.raw)
    print(f"(key {issued.info.id} for {issued.info.user_name}; shown only now, store it safely)",
          flush=True)
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
    print(f"{'ID':>4}  {'PREFIX':<14} {'USER':<20} {'STATUS':<8} {'CREATED':<21} LAST USED")
    for k in keys:
        status = "revoked" if k.revoked else "active"
        print(f"{k.id:>4}  {k.prefix + '…':<14} {k.user_name:<20} {status:<8} "
              f"{format_time(k.created):<21} {format_time(k.last_used)}")
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    db = open_db(args)
    try:
        with db.transaction() as s:
            key = revoke_key(s, args.key)
    finally:
        db.close()
    print(f"revoked key {key.id} ({key.prefix}…) of {key.user_name}")
    return 0
