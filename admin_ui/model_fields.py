"""The Add dialog's typed fields read as `POST /admin/models` takes them: aliases (comma
separated glob patterns), the idle sleep (seconds; empty: the server's --sleep-idle-seconds)
and serve options (`key=value` pairs, or a JSON object). No Qt here.

Only the form is checked here (a number is a number, a pair has its `=`); which options exist
and what values they take the server checks, as for the CLI (app/registry/entry.py), and its
400 sentence is shown as it is.
"""

from __future__ import annotations

import json
import math
from typing import Any

# app/registry/entry.py's INT_OPTIONS, written out (the console imports nothing of the
# server's): the options whose `key=value` value is sent as a whole number.
INT_OPTIONS = ("max_model_len",)


def parse_aliases(text: str) -> list[str]:
    """"gpt-4*, claude-*" -> ["gpt-4*", "claude-*"]; ValueError for a pattern with a space."""
    aliases = [a.strip() for a in text.split(",") if a.strip()]
    for alias in aliases:
        if any(c.isspace() for c in alias):
            raise ValueError(f"An alias has no spaces ({alias!r}); separate aliases with commas.")
    return aliases


def parse_sleep_idle_seconds(text: str) -> float | None:
    """Seconds without a request before the model sleeps: None when empty (the server's
    --sleep-idle-seconds), 0 for never; ValueError for anything but a number of 0 or more."""
    text = text.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"Idle sleep is a number of seconds (0: never), not {text!r}.") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError("Idle sleep must be 0 (never) or more seconds.")
    return seconds


def parse_options(text: str) -> dict[str, Any]:
    """Serve options from `max_model_len=4096 dtype=bfloat16` (spaces or commas between the
    pairs) or from a JSON object; {} when empty. ValueError saying what is malformed."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            options = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"The options are not valid JSON: {exc.msg}.") from None
        if not isinstance(options, dict):
            raise ValueError("The options' JSON must be an object, e.g. {\"dtype\": \"bfloat16\"}.")
        return options
    options: dict[str, Any] = {}
    for pair in text.replace(",", " ").split():
        key, eq, value = pair.partition("=")
        if not eq or not key or not value:
            raise ValueError(f"Write each option as key=value, not {pair!r}.")
        options[key] = _option_value(key, value)
    return options


def _option_value(key: str, value: str) -> Any:
    if key not in INT_OPTIONS:
        return value
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key} must be a whole number, not {value!r}.") from None
