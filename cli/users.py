"""`officellm users add|list|disable|enable|delete|purge-cache`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from officellm.app.db import admin_changes
from officellm.app.db.audit import record_change
from officellm.app.db.paths import kv_disk_dir
from officellm.app.db.users import get_user, list_users
from officellm.cli.actor import cli_actor
from officellm.cli.admin_call import NoServer, add_server_arguments, admin_call, report_failure
from officellm.cli.db import add_db_argument, format_time, open_db


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("users", help="add, list, disable, delete users",
                       description="The people who share this machine.")
    usub = p.add_subparsers(dest="users_command", required=True)
    add = usub.add_parser("add", help="add a user (then: officellm keys issue NAME)")
    add.add_argument("name")
    add_db_argument(add)
    add.set_defaults(func=run_add)
    ls = usub.add_parser("list", help="list users")
    ls.add_argument("--json", action="store_true")
    add_db_argument(ls)
    ls.set_defaults(func=run_list)
    for name, disabled, text in (("disable", True, "refuse a user's keys from now on"),
                                 ("enable", False, "accept a disabled user's keys again")):
        d = usub.add_parser(name, help=text)
        d.add_argument("name")
        add_db_argument(d)
        d.set_defaults(func=run_set_disabled, disabled=disabled)
    for name, run, text, description in (
            ("delete", run_delete, "delete a user, their keys, policy, threads and usage, "
             "and purge their cached context",
             "Delete a user: their keys, policy, threads and usage go with them, and their "
             "cached context is purged as by purge-cache. A user with requests running is "
             "disabled and left for a second try. With no server running, the database row "
             "and the disk tier's files are removed directly."),
            ("purge-cache", run_purge_cache, "forget everything cached from a user's prompts",
             "Drop the user's prefix-cache blocks from every running model's KV pool and RAM "
             "tier and from the KV disk tier (every model's). With no server running, the "
             "disk tier's files are removed directly.")):
        c = usub.add_parser(name, help=text, description=description)
        c.add_argument("name")
        add_server_arguments(c)
        c.add_argument("--kv-disk-dir", type=Path, default=None,
                       help="with no server running: the disk tier's directory (default: "
                            "kv-cache/ beside the database)")
        c.set_defaults(func=run)


def run_add(args: argparse.Namespace) -> int:
    db = open_db(args)
    try:
        with db.transaction() as s:
            user = admin_changes.create_user(s, cli_actor(), args.name)
    finally:
        db.close()
    print(f"added user {user.name} (id {user.id}); "
          f"give them a key: officellm keys issue {user.name}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    db = open_db(args)
    try:
        with db.session() as s:
            users = list_users(s)
    finally:
        db.close()
    if args.json:
        print(json.dumps([u.to_dict() for u in users], indent=2))
        return 0
    if not users:
        print("no users yet (officellm users add NAME)")
        return 0
    print(f"{'ID':>4}  {'NAME':<24} {'STATUS':<9} {'VIA':<16} CREATED")
    for u in users:
        status = "disabled" if u.disabled else "active"
        print(f"{u.id:>4}  {u.name:<24} {status:<9} {u.via or '-':<16} "
              f"{format_time(u.created)}")
    return 0


def run_set_disabled(args: argparse.Namespace) -> int:
    db = open_db(args)
    try:
        with db.transaction() as s:
            user = admin_changes.set_user_disabled(s, cli_actor(), args.name, args.disabled)
    finally:
        db.close()
    print(f"user {user.name} {'disabled' if user.disabled else 'enabled'}")
    return 0


def run_purge_cache(args: argparse.Namespace) -> int:
    try:
        r = admin_call(args, f"users/{args.name}/purge-cache")
    except (NoServer, FileNotFoundError) as exc:  # no server, or none ever started here
        return _purge_disk_directly(args, str(exc))
    if not r.is_success:
        return report_failure("users purge-cache", r)
    done = r.json()
    where = " and the KV disk tier" if done["disk_tier"] else ""
    print(f"{done['user']}: cached context forgotten ({done['pool_blocks']} blocks in the "
          f"running models' pools{where})")
    return 0


def run_delete(args: argparse.Namespace) -> int:
    try:
        r = admin_call(args, f"users/{args.name}", method="DELETE")
    except (NoServer, FileNotFoundError) as exc:  # no server, or none ever started here
        return _purge_disk_directly(args, str(exc), delete=True)
    if not r.is_success:
        return report_failure("users delete", r)
    done = r.json()
    where = " and the KV disk tier" if done["disk_tier"] else ""
    print(f"{done['user']}: deleted, with their keys, policy, threads and usage; cached context "
          f"forgotten ({done['pool_blocks']} blocks in the running models' pools{where})")
    return 0


def _purge_disk_directly(args: argparse.Namespace, why: str, delete: bool = False) -> int:
    """No server to ask (`why`): remove the user's files from the disk tier's directory
    (a running server's pool would keep its copies: it must be asked), and with `delete`
    the user's row after them."""
    from officellm.app.policy import prefix_cache_salt
    from officellm.engine import purge_kv_disk

    db = open_db(args)
    try:
        with db.session() as s:
            user = get_user(s, args.name)
            user_id, name = user.id, user.name
        folder = args.kv_disk_dir or kv_disk_dir(db.files_dir)
        purge_kv_disk(folder, db.kv_disk_key(), prefix_cache_salt(user_id,
                                                                  share_prefix_cache=False))
        with db.transaction() as s:
            if delete:
                admin_changes.delete_user(s, cli_actor(), user_id)
            else:
                record_change(s, cli_actor(), "user.purge_cache", name, None,
                              {"user": name, "pool_blocks": 0, "disk_tier": True})
    finally:
        db.close()
    print(f"{name}: the server could not be asked ({why}); removed their blocks from the KV "
          f"disk tier in {folder}" + ("; deleted them, with their keys, policy, threads and "
                                      "usage" if delete else ""), file=sys.stderr)
    return 0
