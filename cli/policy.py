"""`officellm policy show|set|clear`: the default policy and per-user overrides."""

from __future__ import annotations

import argparse
import json
from typing import Any

from officellm.app.db import admin_changes
from officellm.app.db.policies import POLICY_FIELDS, get_effective_policy, get_policy
from officellm.app.db.tables import ON_LIMIT_CHOICES
from officellm.app.policy.scheduling import PRIORITY_CHOICES, PRIORITY_WEIGHTS
from officellm.cli.actor import cli_actor
from officellm.cli.db import add_db_argument, open_db

_CLEAR_WORDS = ("none", "inherit", "unlimited")


def _limit(value: str) -> int | None:
    if value.lower() in _CLEAR_WORDS:
        return None
    try:
        return int(value.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number or 'none' (inherit / no limit), not {value!r}") from None


def _on_limit(value: str) -> str | None:
    if value.lower() in _CLEAR_WORDS:
        return None
    if value not in ON_LIMIT_CHOICES:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(ON_LIMIT_CHOICES)}")
    return value


def _priority(value: str) -> str | None:
    if value.lower() in _CLEAR_WORDS:
        return None
    if value not in PRIORITY_CHOICES:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(PRIORITY_CHOICES)}")
    return value


def _kv_share(value: str) -> float | None:
    """A fraction (0.5) or a percentage (50%); 'none' clears the cap. The range is checked
    once, by the data layer (validate_policy_fields), with its own sentence."""
    if value.lower() in _CLEAR_WORDS:
        return None
    try:
        return float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a fraction such as 0.5 (or 50%), or 'none', not {value!r}") from None


def _models(value: str) -> list[str] | None:
    """Comma-separated model names; 'all' (or 'none', 'inherit') stores NULL: every model in
    the default policy, the default's list in a user's override."""
    if value.lower() == "all" or value.lower() in _CLEAR_WORDS:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(
            f"expected model names such as qwen3-8b,minilm, or 'all', not {value!r}")
    return names


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("policy", help="show or set the default policy and per-user overrides",
                       description="Thread caps, turn limits, concurrency, daily quotas and "
                                   "scheduling (priority, KV share). Changes apply to the "
                                   "next request; no restart.")
    psub = p.add_subparsers(dest="policy_command", required=True)
    show = psub.add_parser("show", help="the default policy, or a user's override and result")
    show.add_argument("--user", default=None)
    show.add_argument("--json", action="store_true")
    add_db_argument(show)
    show.set_defaults(func=run_show)

    s = psub.add_parser("set", help="change fields of the default policy or a user's override",
                        description="Only the given fields change. 'none' clears a field: a "
                                    "user then inherits the default; the default means no limit.")
    s.add_argument("--user", default=None, help="a user's override (default: the default policy)")
    # default=SUPPRESS: a field not given is absent from args, so "not given" (leave as is)
    # stays distinct from "given as none" (clear).
    unset = argparse.SUPPRESS
    s.add_argument("--max-context-tokens", type=_limit, metavar="N", default=unset,
                   help="cap on a thread's length in tokens")
    s.add_argument("--max-turns", type=_limit, metavar="N", default=unset,
                   help="user messages per thread before 'start a new chat'")
    s.add_argument("--on-limit", type=_on_limit, metavar="|".join(ON_LIMIT_CHOICES),
                   default=unset, help="what happens to a thread over its limit")
    s.add_argument("--max-concurrent-requests", type=_limit, metavar="N", default=unset)
    s.add_argument("--max-tokens-per-day", type=_limit, metavar="N", default=unset,
                   help="prompt + completion tokens per UTC day")
    s.add_argument("--audio-minutes-per-day", type=_limit, metavar="N", default=unset,
                   help="minutes of audio /v1/audio/transcriptions and translations read per "
                        "UTC day")
    s.add_argument("--share-prefix-cache", action=argparse.BooleanOptionalAction, default=unset,
                   help="let the prompts share cached blocks with other sharing users'")
    weights = ", ".join(f"{p} {w:g}" for p, w in PRIORITY_WEIGHTS.items())
    s.add_argument("--priority", type=_priority, metavar="|".join(PRIORITY_CHOICES),
                   default=unset, help=f"weight under --scheduling-policy fair ({weights})")
    s.add_argument("--max-kv-share", type=_kv_share, metavar="FRACTION", default=unset,
                   help="share of the KV cache (above 0, at most 1; or 50%%) above which the "
                        "user's prompts wait while others have work; 'none': no cap")
    s.add_argument("--models", type=_models, metavar="NAME,NAME|all", default=unset,
                   help="the registered models the user may use (officellm models list); "
                        "'all': every model (in a user's override: inherit the default's)")
    add_db_argument(s)
    s.set_defaults(func=run_set)

    c = psub.add_parser("clear", help="remove a user's override (they follow the default)")
    c.add_argument("--user", required=True)
    add_db_argument(c)
    c.set_defaults(func=run_clear)


def _ref(value: str | None) -> int | str | None:
    if value is None:
        return None
    return int(value) if value.isdigit() else value


def _show_value(value: Any, inherit: bool, name: str = "") -> str:
    if value is None:
        return "(inherit)" if inherit else ("all models" if name == "models" else "no limit")
    if name == "models":
        return ", ".join(value) if value else "(none)"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):  # max_kv_share
        return f"{value:g} of the KV cache"
    return f"{value:,}" if isinstance(value, int) else str(value)


def run_show(args: argparse.Namespace) -> int:
    db = open_db(args)
    try:
        with db.transaction() as s:
            stored = get_policy(s, _ref(args.user))
            effective = get_effective_policy(s, _ref(args.user))
    finally:
        db.close()
    if args.json:
        print(json.dumps({"stored": stored.to_dict(), "effective": effective.to_dict()}, indent=2))
        return 0
    who = f"user {args.user}" if args.user else "default policy"
    print(who)
    eff = effective.to_dict()
    for name in POLICY_FIELDS:
        shown = _show_value(getattr(stored, name), inherit=args.user is not None, name=name)
        line = f"  {name:<24} {shown}"
        if args.user is not None and getattr(stored, name) is None:
            line += f" -> {_show_value(eff[name], inherit=False, name=name)}"
        print(line)
    return 0


def run_set(args: argparse.Namespace) -> int:
    values = {f: getattr(args, f) for f in POLICY_FIELDS if hasattr(args, f)}
    if not values:
        raise ValueError("nothing to set; give at least one of --max-context-tokens, "
                         "--max-turns, --on-limit, --max-concurrent-requests, "
                         "--max-tokens-per-day, --share-prefix-cache, --priority, "
                         "--max-kv-share, --models")
    db = open_db(args)
    try:
        with db.transaction() as s:
            stored = admin_changes.set_policy(s, cli_actor(), _ref(args.user), **values)
    finally:
        db.close()
    who = f"user {args.user}" if args.user else "the default policy"
    changes = ", ".join(f"{k}={_show_value(getattr(stored, k), args.user is not None, k)}"
                        for k in values)
    print(f"{who}: {changes}")
    return 0


def run_clear(args: argparse.Namespace) -> int:
    db = open_db(args)
    try:
        with db.transaction() as s:
            removed = admin_changes.clear_policy(s, cli_actor(), _ref(args.user))
    finally:
        db.close()
    print(f"user {args.user}: " + ("override removed, the default applies"
                                   if removed else "had no override"))
    return 0
