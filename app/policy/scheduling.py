"""What the engine's scheduler learns of a user: an opaque key, a weight, a KV share cap.

The engine knows no users (docs/design.md §2): the server tags each request with the user's id
as a string (`fairness_key`), the weight of the user's `priority`, and their `max_kv_share`,
all read from the policy at admission, so a change applies from the next request. The map
back from keys to names (for /metrics, /admin/stats, the console) is the app's, here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from officellm.app.policy.types import EffectivePolicy

Priority = Literal["low", "normal", "high"]
PRIORITY_CHOICES: tuple[Priority, ...] = ("low", "normal", "high")
# docs/design.md §2: under --scheduling-policy fair a backlogged key's share of prompt work is
# proportional to its weight: a high user is owed twice a normal one, four times a low one.
PRIORITY_WEIGHTS: dict[str, float] = {"low": 0.5, "normal": 1.0, "high": 2.0}
DEFAULT_PRIORITY: Priority = "normal"


@dataclass(frozen=True)
class SchedulingTags:
    """The engine's tags for one user's requests (EngineCoreRequest's fields)."""

    fairness_key: str
    priority: float
    max_kv_share: float | None


def scheduling_tags(user_id: int, policy: EffectivePolicy) -> SchedulingTags:
    """The tags for a request of `user_id` under `policy` (read at admission)."""
    return SchedulingTags(fairness_key(user_id), PRIORITY_WEIGHTS[policy.priority],
                          policy.max_kv_share)


def fairness_key(user_id: int) -> str:
    return str(user_id)


def user_id_of_key(key: str) -> int | None:
    """The user id a key stands for; None for a key the server did not make (the engine's
    default key, for requests without one)."""
    return int(key) if key.isdigit() else None


def by_user_name(per_key: Mapping[str, int], names: Mapping[int, str]) -> dict[str, int]:
    """Per-key numbers (EngineStats' *_by_key) under user names; keys of unknown users (a
    user deleted meanwhile) under "user <id>", the engine's default key under "(none)"."""
    out: dict[str, int] = {}
    for key, value in per_key.items():
        uid = user_id_of_key(key)
        name = names.get(uid, f"user {uid}") if uid is not None else "(none)"
        out[name] = out.get(name, 0) + value
    return out
