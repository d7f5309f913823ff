"""`officellm models add|list|remove|pin|unpin|pull|load|unload`: the model registry.

add, list, remove, pin, unpin and pull work on the database, as `officellm users` does (a
running server sees the change when it next reads the registry); load and unload ask the
running server through its admin API."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from officellm.app.db import admin_changes
from officellm.app.db.errors import NotFound
from officellm.app.db.registered_models import get_entry, list_entries
from officellm.app.registry.entry import (
    BUNDLED,
    ENGINE_OPTIONS,
    GENERATE,
    INT_OPTIONS,
    KINDS,
    PARSER_OPTIONS,
    ModelEntry,
)
from officellm.cli.actor import cli_actor
from officellm.cli.admin_call import (
    NoServer,
    add_server_arguments,
    admin_call,
    report_failure,
)
from officellm.cli.db import add_db_argument, open_db

# The engine's own flag help, shown for the options an entry may set (a copy, so that
# `officellm models --help` does not import the engine and torch).
ENGINE_OPTION_HELP = {
    "dtype": "auto | float32 | bfloat16 | float16",
    "quantization": "auto | gguf | int8 | int4 | none",
    "kv_cache_dtype": "auto | float32 | bfloat16 | float16 | fp8_e4m3 | fp8_e5m2 | int8",
    "max_model_len": "longest request (prompt plus output) in tokens",
    "kv_cache_memory": "this model's KV pool, e.g. 4GiB",
}
METAVARS = {"dtype": "DTYPE", "quantization": "Q", "kv_cache_dtype": "DTYPE",
            "max_model_len": "N", "kv_cache_memory": "SIZE"}


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def _add_serve_options(p: argparse.ArgumentParser) -> None:
    """The ENGINE_OPTIONS and PARSER_OPTIONS flags; what is not given stays the server's."""
    for option in ENGINE_OPTIONS:
        p.add_argument(_flag(option), type=int if option in INT_OPTIONS else str,
                       default=argparse.SUPPRESS, metavar=METAVARS[option],
                       help=ENGINE_OPTION_HELP[option])
    for option, choices in PARSER_OPTIONS.items():
        p.add_argument(_flag(option), choices=choices, default=argparse.SUPPRESS,
                       help="as serve's flag of the same name, for this model")


def _serve_options(args: argparse.Namespace) -> dict[str, Any]:
    return {o: getattr(args, o) for o in (*ENGINE_OPTIONS, *PARSER_OPTIONS) if hasattr(args, o)}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="register the models the server serves by name",
                       description="The model registry (docs/models.md): each entry names a "
                                   "model directory, a .gguf file or the bundled model, how "
                                   "it is served, and whether it stays loaded (pinned).")
    msub = p.add_subparsers(dest="models_command", required=True)

    add = msub.add_parser("add", help="register a model under a name")
    add.add_argument("name", help="the name requests use as `model`")
    add.add_argument("source", help="a Hugging Face model directory, a .gguf file, or "
                                    f"'{BUNDLED}' (SmolLM2-135M, or all-MiniLM-L6-v2 with "
                                    "--kind embed)")
    _add_entry_arguments(add)
    add_db_argument(add)
    add.set_defaults(func=run_add)

    ls = msub.add_parser("list", help="list the registered models")
    ls.add_argument("--json", action="store_true")
    add_db_argument(ls)
    ls.set_defaults(func=run_list)

    rm = msub.add_parser("remove", help="unregister a model (its files stay)")
    rm.add_argument("name")
    add_db_argument(rm)
    rm.set_defaults(func=run_remove)

    for name, pinned, text in (("pin", True, "load a model at start and never unload it"),
                               ("unpin", False, "let a model be unloaded to make room")):
        pin = msub.add_parser(name, help=text)
        pin.add_argument("name")
        add_db_argument(pin)
        pin.set_defaults(func=run_pin, pinned=pinned)

    pull = msub.add_parser("pull", help="download a model from the Hugging Face Hub and "
                                        "register it",
                           description="Fetches only what the engine reads (config, tokenizer, "
                                       "safetensors; or one .gguf) into the data directory's "
                                       "models/ folder; run it again to continue an "
                                       "interrupted download.")
    pull.add_argument("repo_id", metavar="REPO_ID", help="e.g. Qwen/Qwen3-0.6B")
    pull.add_argument("--name", default=None,
                      help="the registered name (default: the repo's last part)")
    pull.add_argument("--revision", default=None, help="branch, tag or commit (default: main)")
    pull.add_argument("--filename", default=None,
                      help="the one .gguf to fetch from a repo of GGUF files")
    _add_entry_arguments(pull)
    add_db_argument(pull)
    pull.set_defaults(func=run_pull)

    for name in ("load", "unload"):
        c = msub.add_parser(name, help=f"ask the running server to {name} a registered model")
        c.add_argument("name")
        add_server_arguments(c)
        c.set_defaults(func=run_server_action, action=name)


def _add_entry_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", choices=KINDS, default=GENERATE,
                   help="generate (chat and completions) or embed (/v1/embeddings)")
    p.add_argument("--pin", action="store_true",
                   help="load it at start and never unload it to make room")
    p.add_argument("--alias", dest="aliases", action="append", default=[], metavar="PATTERN",
                   help="a request model name (glob, e.g. 'gpt-4*') that reaches this model; "
                        "repeat for more")
    p.add_argument("--sleep-idle-seconds", type=float, default=None, metavar="N",
                   help="free its weights and KV pool after N seconds without a request "
                        "(0: never; default: serve's --sleep-idle-seconds)")
    _add_serve_options(p)


def _source(value: str) -> str:
    """BUNDLED as is; a path must exist (a directory or a .gguf file) and is stored absolute,
    so the server finds it whatever directory it was started from."""
    if value == BUNDLED:
        return value
    path = Path(value).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix == ".gguf"):
        return str(path.resolve())
    if path.exists():
        raise ValueError(f"{value} is neither a model directory nor a .gguf file.")
    raise ValueError(f"No such model directory or .gguf file: {value} (or use '{BUNDLED}').")


def _entry(args: argparse.Namespace, name: str, source: str,
           hub_repo: str | None = None) -> ModelEntry:
    entry = ModelEntry(name=name, source=source, kind=args.kind, pinned=args.pin,
                       aliases=tuple(args.aliases), sleep_idle_seconds=args.sleep_idle_seconds,
                       options=_serve_options(args), hub_repo=hub_repo)
    entry.check()
    return entry


def _describe(entry: ModelEntry) -> str:
    pinned = ", pinned" if entry.pinned else ""
    return f"{entry.name} ({entry.kind}{pinned}) -> {entry.source}"


def run_add(args: argparse.Namespace) -> int:
    entry = _entry(args, args.name, _source(args.source))
    db = open_db(args)
    try:
        with db.transaction() as s:
            admin_changes.add_model(s, cli_actor(), entry)
    finally:
        db.close()
    print(f"registered {_describe(entry)}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    db = open_db(args)
    try:
        with db.session() as s:
            entries = list_entries(s)
    finally:
        db.close()
    if args.json:
        print(json.dumps([e.to_dict() for e in entries], indent=2))
        return 0
    if not entries:
        print("no models registered (officellm models add NAME SOURCE, or models pull REPO_ID)")
        return 0
    print(f"{'NAME':<24} {'KIND':<9} {'PINNED':<7} {'ALIASES':<20} SOURCE")
    for e in entries:
        options = " ".join(f"{k}={v}" for k, v in e.options.items())
        print(f"{e.name:<24} {e.kind:<9} {'yes' if e.pinned else 'no':<7} "
              f"{','.join(e.aliases) or '-':<20} {e.source}" + (f"  [{options}]" if options
                                                                else ""))
    return 0


def run_remove(args: argparse.Namespace) -> int:
    db = open_db(args)
    try:
        with db.transaction() as s:
            removed = admin_changes.remove_model(s, cli_actor(), args.name)
    finally:
        db.close()
    if not removed:
        raise NotFound(f"No model named {args.name!r} is registered.")
    print(f"removed {args.name} (its files, if any, are where they were)")
    return 0


def run_pin(args: argparse.Namespace) -> int:
    db = open_db(args)
    try:
        with db.transaction() as s:
            entry = admin_changes.change_model(s, cli_actor(), args.name, pinned=args.pinned)
    finally:
        db.close()
    if entry is None:
        raise NotFound(f"No model named {args.name!r} is registered.")
    print(f"{entry.name} {'pinned' if entry.pinned else 'unpinned'}")
    return 0


class _ProgressLine:
    """One line on stderr, rewritten in place, at most a few times a second."""

    def __init__(self, label: str) -> None:
        self.label, self.last = label, 0.0

    def __call__(self, done: int, total: int | None) -> None:
        now = time.monotonic()
        if now - self.last < 0.2 and done != total:
            return
        self.last = now
        mib = 1024 ** 2
        shown = f"{done / mib:,.1f} MiB"
        if total:
            shown += f" of {total / mib:,.1f} MiB ({100 * done // total}%)"
        print(f"\r{self.label}: {shown}", end="", file=sys.stderr, flush=True)


def run_pull(args: argparse.Namespace) -> int:
    from officellm.app.registry.hub_pull import pull, pulled_dir
    from officellm.engine import check_architecture

    name = args.name or args.repo_id.rstrip("/").rpartition("/")[2]
    dest = pulled_dir(args.repo_id)
    # Checked before the download: a bad option or a taken name should not cost gigabytes.
    _entry(args, name, str(dest))
    db = open_db(args)
    try:
        with db.session() as s:
            if get_entry(s, name) is not None:
                raise ValueError(f"A model named {name!r} is already registered; choose "
                                 f"another with --name, or remove it first.")
        source = pull(args.repo_id, dest, revision=args.revision,
                      progress=_ProgressLine(f"pulling {args.repo_id}"), filename=args.filename,
                      check_config=check_architecture if args.kind == "generate" else None)
        print(file=sys.stderr)
        entry = _entry(args, name, str(source), hub_repo=args.repo_id)
        with db.transaction() as s:
            admin_changes.add_model(s, cli_actor(), entry)
    finally:
        db.close()
    print(f"registered {_describe(entry)}")
    return 0


def run_server_action(args: argparse.Namespace) -> int:
    try:
        r = admin_call(args, f"models/{args.name}/{args.action}")
    except NoServer as exc:
        print(f"officellm models {args.action}: {exc}", file=sys.stderr)
        return 1
    if r.is_success:
        print(f"{args.name}: {args.action}ed")
        return 0
    return report_failure(f"models {args.action}", r)
