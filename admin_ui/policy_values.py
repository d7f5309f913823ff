"""Policy form values <-> the admin API's POLICY JSON, with the same validation rules as the
server (app.db.policies.validate_policy_fields), so a mistake is named before Save is sent.

Blank means None: in the default policy "no limit", in a user's override "inherit".
`models` is text too: comma-separated model names; blank (or "all", the CLI's word) is None,
every model in the default policy and the default's list in a user's override; "none" is the
empty list, no model at all (a model that is itself named "none" or "all": add a comma,
"none,").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INT_FIELDS = ("max_context_tokens", "max_turns", "max_concurrent_requests", "max_tokens_per_day",
              "audio_minutes_per_day")
ON_LIMIT_CHOICES = ("reject", "notify", "truncate")
# The server's (app/policy/scheduling.py): the weight each priority gets under the fair
# scheduler, shown beside the choice.
PRIORITY_WEIGHTS = {"low": 0.5, "normal": 1.0, "high": 2.0}
PRIORITY_CHOICES = tuple(PRIORITY_WEIGHTS)
LABELS = {
    "max_context_tokens": "Max context (tokens per thread)",
    "max_turns": "Max turns per thread",
    "on_limit": "When a thread hits its limit",
    "max_concurrent_requests": "Max concurrent requests",
    "max_tokens_per_day": "Max tokens per day",
    "audio_minutes_per_day": "Audio minutes per day",
    "share_prefix_cache": "Share prefix cache",
    "priority": "Priority (fair scheduling)",
    "max_kv_share": "Max share of the KV cache",
    "models": "Models this policy allows",
}
# The server's rule for a model name (app/registry/entry.py ModelEntry.check).
MODEL_NAME_MAX = 128
# Typed alone in the models field: "none" is the empty list (no model), "all" the same as
# blank (None). A model named so is written with a comma after it ("none,").
MODELS_NONE = "none"
MODELS_ALL = "all"


@dataclass
class PolicyForm:
    """The form's raw state: text for numbers, "" for inherit in on_limit / share."""

    max_context_tokens: str = ""
    max_turns: str = ""
    on_limit: str = ""
    max_concurrent_requests: str = ""
    max_tokens_per_day: str = ""
    audio_minutes_per_day: str = ""
    share_prefix_cache: str = ""  # "yes" | "no" | "" (inherit)
    priority: str = ""  # "low" | "normal" | "high" | "" (inherit)
    max_kv_share: str = ""  # "0.5" or "50%"; "" = no cap (default) or inherit (user)
    # "qwen3-8b, minilm"; "" (or "all") = every model (default) or inherit (user);
    # "none" = the empty list, no model
    models: str = ""

    @classmethod
    def from_policy(cls, policy: dict[str, Any] | None) -> PolicyForm:
        p = policy or {}
        form = cls()
        for name in INT_FIELDS:
            value = p.get(name)
            setattr(form, name, "" if value is None else str(value))
        form.on_limit = p.get("on_limit") or ""
        share = p.get("share_prefix_cache")
        form.share_prefix_cache = "" if share is None else ("yes" if share else "no")
        form.priority = p.get("priority") or ""
        kv_share = p.get("max_kv_share")
        form.max_kv_share = "" if kv_share is None else f"{kv_share:g}"
        form.models = models_to_text(p.get("models"))
        return form


def models_to_text(models: list[str] | None) -> str:
    """The models field's text for the server's `models`: "" for None, "none" for []."""
    if models is None:
        return ""
    if not models:
        return MODELS_NONE
    text = ", ".join(models)
    # One model whose name is a keyword: the comma keeps it a name.
    return text + "," if text.lower() in (MODELS_NONE, MODELS_ALL) else text


def parse_models(text: str) -> list[str] | None:
    """The server's `models` for the field's text, or ValueError saying what is wrong.
    Names are split on commas and trimmed; a repeated name is kept once."""
    text = text.strip()
    if not text or text.lower() == MODELS_ALL:
        return None
    if text.lower() == MODELS_NONE:
        return []
    names: list[str] = []
    bad: list[str] = []
    for piece in text.split(","):
        name = piece.strip()
        if not name:
            continue
        if any(c.isspace() for c in name) or len(name) > MODEL_NAME_MAX:
            bad.append(name)
        elif name not in names:
            names.append(name)
    if bad:
        raise ValueError(f"model names are 1 to {MODEL_NAME_MAX} characters without spaces, "
                         f"separated by commas; not {', '.join(map(repr, bad))}")
    if not names:
        raise ValueError(f"write model names separated by commas, {MODELS_NONE!r} for no "
                         f"model, or leave it blank; not {text!r}")
    return names


class PolicyError(ValueError):
    """One sentence per bad field."""

    def __init__(self, problems: dict[str, str]) -> None:
        super().__init__("; ".join(problems.values()))
        self.problems = problems


def form_to_policy(form: PolicyForm, is_default: bool) -> dict[str, Any]:
    """The PUT body for this form, or PolicyError naming each field that is wrong."""
    problems: dict[str, str] = {}
    out: dict[str, Any] = {}
    for name in INT_FIELDS:
        text = getattr(form, name).strip().replace(",", "").replace("_", "")
        if not text:
            out[name] = None
            continue
        try:
            value = int(text)
        except ValueError:
            problems[name] = f"{LABELS[name]} must be a whole number (or blank), not {text!r}"
            continue
        if value < 1:
            problems[name] = f"{LABELS[name]} must be at least 1 (leave it blank for " + \
                ("no limit)" if is_default else "the default)")
            continue
        out[name] = value
    if form.on_limit:
        if form.on_limit not in ON_LIMIT_CHOICES:
            problems["on_limit"] = f"{LABELS['on_limit']} must be one of " \
                                   f"{', '.join(ON_LIMIT_CHOICES)}"
        else:
            out["on_limit"] = form.on_limit
    elif is_default:
        problems["on_limit"] = "the default policy needs an action for when a limit is hit"
    else:
        out["on_limit"] = None
    if form.share_prefix_cache in ("yes", "no"):
        out["share_prefix_cache"] = form.share_prefix_cache == "yes"
    elif is_default:
        problems["share_prefix_cache"] = "the default policy needs yes or no for sharing"
    else:
        out["share_prefix_cache"] = None
    if form.priority:
        if form.priority not in PRIORITY_CHOICES:
            problems["priority"] = f"{LABELS['priority']} must be one of " \
                                   f"{', '.join(PRIORITY_CHOICES)}"
        else:
            out["priority"] = form.priority
    elif is_default:
        problems["priority"] = "the default policy needs a priority (normal, usually)"
    else:
        out["priority"] = None
    text = form.max_kv_share.strip()
    if not text:
        out["max_kv_share"] = None
    else:
        try:
            share = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            share = None
        if share is None or not 0 < share <= 1:
            problems["max_kv_share"] = f"{LABELS['max_kv_share']} must be a fraction above 0 " \
                                       f"and at most 1 (0.5 or 50%), or blank, not {text!r}"
        else:
            out["max_kv_share"] = share
    try:
        out["models"] = parse_models(form.models)
    except ValueError as exc:
        problems["models"] = f"{LABELS['models']}: {exc}"
    if problems:
        raise PolicyError(problems)
    return out
