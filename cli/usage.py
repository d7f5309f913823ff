"""`officellm usage`: who used how much of which model, by user, model or day, read from the
database the server writes (as GET /admin/usage reports it): a table, or CSV with --csv."""

from __future__ import annotations

import argparse
import csv
import sys
from datetime import date

from officellm.app.db.records import UsageCounts, UsageReportRow
from officellm.app.db.usage import (
    COUNTERS,
    DEFAULT_REPORT_DAYS,
    REPORT_BY,
    report_range,
    report_total,
    usage_report,
)
from officellm.cli.db import add_db_argument, open_db

# The table's column heads, in COUNTERS' order (CSV heads are the counters' own names).
HEADS = {"requests": "REQUESTS", "prompt_tokens": "PROMPT", "cached_tokens": "CACHED",
         "completion_tokens": "COMPLETION", "embedding_requests": "EMBED REQ",
         "embedding_tokens": "EMBED TOK", "task_requests": "TASK REQ",
         "task_tokens": "TASK TOK", "busy_seconds": "BUSY S", "images": "IMAGES",
         "audio_requests": "AUDIO REQ", "audio_seconds": "AUDIO S", "rerank_requests": "RERANK REQ",
         "rerank_tokens": "RERANK TOK"}
UNKNOWN_MODEL = "(unknown)"  # usage counted before rows named their model (migration 0011)


def _day(value: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a day (YYYY-MM-DD)") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("usage", help="usage by user, model or day (requests, tokens, time)",
                       description="Requests, prompt (and prefix-cached), completion, "
                                   "embedding and background-task tokens, and engine time, "
                                   "summed by user, model or UTC day. Never message content.")
    p.add_argument("--since", type=_day, default=None,
                   help=f"first UTC day, YYYY-MM-DD (default: {DEFAULT_REPORT_DAYS} days up to "
                        "--until)")
    p.add_argument("--until", type=_day, default=None,
                   help="last UTC day, included (default: today)")
    p.add_argument("--by", choices=REPORT_BY, default="user", help="group by (default user)")
    p.add_argument("--user", default=None, help="only this user's usage")
    p.add_argument("--model", default=None, help="only this model's usage")
    p.add_argument("--csv", action="store_true", help="CSV on stdout instead of a table")
    add_db_argument(p)
    p.set_defaults(func=run)


def _name(row: UsageReportRow, by: str) -> str:
    if by == "day":
        assert row.day is not None
        return row.day.isoformat()
    name = row.user if by == "user" else row.model
    return name or UNKNOWN_MODEL


def _cells(counts: UsageCounts, seconds: str = ".1f") -> list[str]:
    return [format(getattr(counts, c), seconds) if c == "busy_seconds"
            else str(getattr(counts, c)) for c in COUNTERS]


def write_csv(rows: list[UsageReportRow], by: str) -> None:
    """One header line (`by`, then the counters' names) and one line per group."""
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow([by, *COUNTERS])
    for r in rows:
        out.writerow([_name(r, by), *_cells(r.counts, seconds=".3f")])


def print_table(rows: list[UsageReportRow], by: str, since: date, until: date) -> None:
    """The groups under aligned heads, then their total."""
    print(f"usage {since} to {until} (UTC), by {by}")
    names = [_name(r, by) for r in rows]
    width = max([len(by), len("TOTAL"), *map(len, names)])
    widths = [max(len(HEADS[c]), 10) for c in COUNTERS]

    def line(first: str, cells: list[str]) -> str:
        return "  ".join([first.ljust(width), *(c.rjust(w) for c, w in zip(cells, widths,
                                                                           strict=True))])

    print(line(by.upper(), [HEADS[c] for c in COUNTERS]))
    for name, r in zip(names, rows, strict=True):
        print(line(name, _cells(r.counts)))
    print(line("TOTAL", _cells(report_total(rows))))


def run(args: argparse.Namespace) -> int:
    since, until = report_range(args.since, args.until)  # ValueError: exit 2, said in one line
    db = open_db(args)
    try:
        with db.session() as s:
            rows = usage_report(s, since, until, args.by, user=args.user, model=args.model)
    finally:
        db.close()
    if args.csv:
        write_csv(rows, args.by)
    else:
        print_table(rows, args.by, since, until)
    return 0
