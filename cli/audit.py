"""`officellm audit`: the audit log, newest first (who changed which user, key, policy or
model, when, from what to what), read from the database as `officellm users list` is."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from typing import Any

from officellm.app.db.audit import AuditQuery, audit_entries
from officellm.cli.db import add_db_argument, format_time, open_db


def _time(value: str) -> datetime:
    """An ISO 8601 date or time (2026-12-01, 2026-12-01T09:00); UTC unless it names a zone."""
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a date or time such as 2026-12-01 or 2026-12-01T09:00, not {value!r}"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="who changed which user, key, policy or model, and when",
                       description="The audit log, newest first: every change made through "
                                   "the admin API, the console or these commands, with who "
                                   "made it and the values before and after.")
    p.add_argument("--since", type=_time, default=None, metavar="TIME",
                   help="from this date or time on (UTC unless a zone is given)")
    p.add_argument("--until", type=_time, default=None, metavar="TIME",
                   help="before this date or time")
    p.add_argument("--actor", default=None,
                   help="one actor (cli:alice, console:bob, admin-token) or a kind (cli, "
                        "console)")
    p.add_argument("--action", default=None,
                   help="one action, e.g. user.create, key.revoke, policy.set, model.load")
    p.add_argument("--limit", type=int, default=100, help="at most this many rows (100)")
    p.add_argument("--json", action="store_true")
    add_db_argument(p)
    p.set_defaults(func=run)


def _changes(before: Any, after: Any) -> str:
    """The fields that differ, as name: old -> new (the whole value for an add or removal)."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        value = after if after is not None else before
        return json.dumps(value, sort_keys=True) if value is not None else ""
    changed = [k for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]
    return ", ".join(f"{k}: {json.dumps(before.get(k))} -> {json.dumps(after.get(k))}"
                     for k in changed) or "(no change)"


def run(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise ValueError("--limit must be 1 or more")
    query = AuditQuery(since=args.since, until=args.until, actor=args.actor,
                       action=args.action, limit=args.limit)
    db = open_db(args)
    try:
        with db.session() as s:
            entries = audit_entries(s, query)
    finally:
        db.close()
    if args.json:
        print(json.dumps([e.to_dict() for e in entries], indent=2))
        return 0
    if not entries:
        print("no changes recorded")
        return 0
    print(f"{'TIME':<21} {'ACTOR':<20} {'ACTION':<17} {'TARGET':<20} CHANGE")
    for e in entries:
        print(f"{format_time(e.time):<21} {e.actor:<20} {e.action:<17} {e.target:<20} "
              f"{_changes(e.before, e.after)}")
    return 0
