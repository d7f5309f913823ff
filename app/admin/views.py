"""The JSON shapes of docs/admin_api.md, built from the data layer's records."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from app.db import EventInfo, KeyInfo, ThreadInfo, UsageDay, UserInfo
from app.db.policies import StoredPolicy
from app.db.records import IssuedKey
from app.policy.types import EffectivePolicy


def iso(value: datetime | date | None) -> str | None:
    return value.isoformat() if value is not None else None


def usage_counts(day: UsageDay | None) -> dict[str, int]:
    if day is None:
        return {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
    return {"requests": day.requests, "prompt_tokens": day.prompt_tokens,
            "completion_tokens": day.completion_tokens}


def user_view(user: UserInfo, today: UsageDay | None) -> dict[str, Any]:
    return {"id": user.id, "name": user.name, "disabled": user.disabled,
            "created": iso(user.created), "usage_today": usage_counts(today)}


def key_view(key: KeyInfo) -> dict[str, Any]:
    return {"id": key.id, "prefix": key.prefix, "user": key.user_name,
            "created": iso(key.created), "last_used": iso(key.last_used), "revoked": key.revoked}


def issued_key_view(issued: IssuedKey) -> dict[str, Any]:
    return {"key": issued.raw, "id": issued.info.id, "prefix": issued.info.prefix,
            "user": issued.info.user_name}


POLICY_KEYS = ("max_context_tokens", "max_turns", "on_limit", "max_concurrent_requests",
               "max_tokens_per_day", "share_prefix_cache")


def policy_view(policy: StoredPolicy | EffectivePolicy) -> dict[str, Any]:
    return {k: getattr(policy, k) for k in POLICY_KEYS}


def thread_view(t: ThreadInfo, cap: int | None) -> dict[str, Any]:
    return {"user": t.user_name, "thread_key": t.thread_key, "turns": t.turns,
            "length": t.length, "last_prompt_tokens": t.last_prompt_tokens,
            "last_completion_tokens": t.last_completion_tokens,
            "first_seen": iso(t.first_seen), "last_seen": iso(t.last_seen), "cap": cap}


def usage_view(u: UsageDay, user_name: str | None) -> dict[str, Any]:
    return {"user": user_name, "day": iso(u.day), **usage_counts(u)}


def event_view(e: EventInfo, user_name: str | None) -> dict[str, Any]:
    return {"time": iso(e.time), "kind": e.kind, "user": user_name, "detail": e.detail}
