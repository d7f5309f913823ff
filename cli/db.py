"""`officellm db upgrade|downgrade|current`, and the --db option shared by the data commands."""

from __future__ import annotations

import argparse
import os
from datetime import datetime
from pathlib import Path

from officellm.app.db.database import Database
from officellm.app.db.paths import default_db_path

DATABASE_URL_ENV = "OFFICELLM_DATABASE_URL"


def _db_file(value: str) -> Path:
    """--db's value: a file path. A URL there would become a file under a directory named
    after its scheme (`sqlite:/...`), so it is refused with the flag that takes it."""
    if "://" in value:
        raise argparse.ArgumentTypeError(
            f"{value!r} is a URL; --db takes a SQLite file path, --database-url a URL")
    return Path(value)


def add_db_argument(parser: argparse.ArgumentParser, help_suffix: str = "") -> None:
    """Add `--db PATH` (a SQLite file; default: officellm.db in the user's data directory)
    and `--database-url URL` (default: $OFFICELLM_DATABASE_URL), one or the other."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--db", type=_db_file, default=None,
                       help=f"SQLite database file (default {default_db_path()}){help_suffix}")
    which.add_argument("--database-url", default=os.environ.get(DATABASE_URL_ENV) or None,
                       metavar="URL",
                       help="a shared database instead of the file: "
                            "postgresql+psycopg://USER:PASSWORD@HOST/NAME (docs/cluster.md); "
                            f"default ${DATABASE_URL_ENV}{help_suffix}")


def database_target(args: argparse.Namespace) -> str | Path | None:
    """What --db or --database-url names (None: the default file). --db wins over the
    environment's URL, so a file named on the command line is the one used."""
    return args.db if args.db is not None else args.database_url


def open_db(args: argparse.Namespace, upgrade: bool = True) -> Database:
    """The database named by --db or --database-url; brought to the newest schema unless
    upgrade=False (the server does the same at start, so the data commands work on a fresh
    install too)."""
    db = Database(database_target(args))
    if upgrade:
        db.upgrade()
    return db


def format_time(value: datetime | None) -> str:
    """A timestamp for tables: UTC to the second, or '-'."""
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value is not None else "-"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("db", help="database schema: upgrade, downgrade, current revision",
                       description="Manage the schema of officellm's database.")
    dsub = p.add_subparsers(dest="db_command", required=True)
    up = dsub.add_parser("upgrade", help="upgrade the schema (default: to the newest)")
    up.add_argument("revision", nargs="?", default="head")
    add_db_argument(up)
    up.set_defaults(func=run_upgrade)
    down = dsub.add_parser("downgrade", help="downgrade the schema ('base' removes every table)")
    down.add_argument("revision")
    add_db_argument(down)
    down.set_defaults(func=run_downgrade)
    cur = dsub.add_parser("current", help="print the schema revision")
    add_db_argument(cur)
    cur.set_defaults(func=run_current)


def run_upgrade(args: argparse.Namespace) -> int:
    db = open_db(args, upgrade=False)
    try:
        db.upgrade(args.revision)
        print(f"{db.name}: at {db.current_revision()}")
    finally:
        db.close()
    return 0


def run_downgrade(args: argparse.Namespace) -> int:
    db = open_db(args, upgrade=False)
    try:
        db.downgrade(args.revision)
        print(f"{db.name}: at {db.current_revision() or 'base (empty)'}")
    finally:
        db.close()
    return 0


def run_current(args: argparse.Namespace) -> int:
    db = open_db(args, upgrade=False)
    try:
        rev = db.current_revision()
        behind = rev is not None and not db.is_at_head()
        note = " (not the newest; run `officellm db upgrade`)" if behind else ""
        print(f"{db.name}: at {rev or 'base (empty)'}{note}")
    finally:
        db.close()
    return 0
