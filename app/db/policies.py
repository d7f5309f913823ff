"""Policies: the default row, per-user overrides, and their merge."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from officellm.app.db.events import record_event
from officellm.app.db.tables import ON_LIMIT_CHOICES, Policy, User
from officellm.app.db.users import UserRef, get_user
from officellm.app.policy.scheduling import DEFAULT_PRIORITY, PRIORITY_CHOICES
from officellm.app.policy.types import EffectivePolicy

INT_FIELDS = ("max_context_tokens", "max_turns", "max_concurrent_requests", "max_tokens_per_day",
              "audio_minutes_per_day")
# A limit is a whole number in this range; the top is SQLite's largest integer (a larger one
# cannot be stored at all).
LIMIT_RANGE = (1, 2**63 - 1)
# max_kv_share is a fraction of the KV pool: above 0 (a cap of nothing would hold every prompt
# of the user back whenever anyone else has work), at most 1 (the whole pool: no cap at all).
KV_SHARE_RANGE = (0.0, 1.0)
POLICY_FIELDS = (*INT_FIELDS, "on_limit", "share_prefix_cache", "priority", "max_kv_share",
                 "models")
# A model name in `models` follows the registry's rule (app/registry/entry.py ModelEntry.check).
MODEL_NAME_MAX = 128
# Fields the default row must keep a value for (None there is not "no limit").
REQUIRED_IN_DEFAULT = ("on_limit", "share_prefix_cache", "priority")


@dataclass(frozen=True)
class StoredPolicy:
    """A policy row as stored: in a user's row None means "inherit the default"; in the
    default row, None on a limit means "no limit"."""

    user_id: int | None
    max_context_tokens: int | None = None
    max_turns: int | None = None
    on_limit: str | None = None
    max_concurrent_requests: int | None = None
    max_tokens_per_day: int | None = None
    audio_minutes_per_day: int | None = None
    share_prefix_cache: bool | None = None
    priority: str | None = None
    max_kv_share: float | None = None
    # The model names the user may use; None: every model (default row) or inherit (user's).
    models: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["models"] = list(self.models) if self.models is not None else None
        return out


def _stored(row: Policy | None, user_id: int | None) -> StoredPolicy:
    if row is None:
        return StoredPolicy(user_id=user_id)
    values = {f: getattr(row, f) for f in POLICY_FIELDS}
    if values["models"] is not None:
        values["models"] = tuple(values["models"])
    return StoredPolicy(user_id=row.user_id, **values)


def _check_models(value: Any) -> None:
    """`models` is a JSON list of model names (strings without spaces); an empty list is
    allowed and means no model at all."""
    bad = (not isinstance(value, (list, tuple))
           or any(not isinstance(n, str) or not n or len(n) > MODEL_NAME_MAX
                  or any(c.isspace() for c in n) for n in value))
    if bad:
        raise ValueError(f"models must be a list of model names (1 to {MODEL_NAME_MAX} "
                         f"characters without spaces), or null for every model, not {value!r}")


def validate_policy_fields(values: dict[str, Any], is_default: bool) -> dict[str, Any]:
    """Check policy fields; return them unchanged or raise ValueError saying what is wrong.

    None clears a field (inherit, in a user's row; no limit, in the default row), except that
    the default row must keep an on_limit, a share_prefix_cache and a priority.
    """
    for name, value in values.items():
        if name not in POLICY_FIELDS:
            raise ValueError(f"unknown policy field {name!r}; known: {', '.join(POLICY_FIELDS)}")
        if value is None:
            if is_default and name in REQUIRED_IN_DEFAULT:
                raise ValueError(f"the default policy needs a value for {name}")
            continue
        if name in INT_FIELDS:
            if isinstance(value, bool) or not isinstance(value, int) or value < LIMIT_RANGE[0]:
                raise ValueError(
                    f"{name} must be a whole number of at least {LIMIT_RANGE[0]}, not {value!r}")
            if value > LIMIT_RANGE[1]:
                raise ValueError(f"{name} must be at most {LIMIT_RANGE[1]}, not {value!r}")
        elif name == "on_limit":
            if value not in ON_LIMIT_CHOICES:
                raise ValueError(
                    f"on_limit must be one of {', '.join(ON_LIMIT_CHOICES)}, not {value!r}")
        elif name == "share_prefix_cache" and not isinstance(value, bool):
            raise ValueError(f"share_prefix_cache must be true or false, not {value!r}")
        elif name == "priority" and value not in PRIORITY_CHOICES:
            raise ValueError(
                f"priority must be one of {', '.join(PRIORITY_CHOICES)}, not {value!r}")
        elif name == "max_kv_share":
            lo, hi = KV_SHARE_RANGE
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not lo < value <= hi):
                raise ValueError(f"max_kv_share must be a fraction of the KV pool above {lo:g} "
                                 f"and at most {hi:g} (blank: no cap), not {value!r}")
        elif name == "models":
            _check_models(value)
    return values


def _default_row(session: Session) -> Policy:
    row = session.scalar(select(Policy).where(Policy.user_id.is_(None)).order_by(Policy.id))
    if row is None:  # the first migration seeds it; a hand-edited file may have lost it
        row = Policy(user_id=None, on_limit="reject", share_prefix_cache=False,
                     priority=DEFAULT_PRIORITY)
        session.add(row)
        session.flush()
    return row


def _user_row(session: Session, user_id: int) -> Policy | None:
    return session.scalar(select(Policy).where(Policy.user_id == user_id))


def get_policy(session: Session, user: UserRef | None = None) -> StoredPolicy:
    """The stored row: the default (user None) or the user's override (all None if none)."""
    if user is None:
        return _stored(_default_row(session), None)
    user_id = get_user(session, user).id
    return _stored(_user_row(session, user_id), user_id)


def merge_policies(default: StoredPolicy, override: StoredPolicy | None) -> EffectivePolicy:
    """A user's effective policy: each field from the override unless it is None there."""
    values: dict[str, Any] = {}
    for name in POLICY_FIELDS:
        value = getattr(override, name) if override is not None else None
        values[name] = getattr(default, name) if value is None else value
    values["on_limit"] = values["on_limit"] or "reject"
    values["share_prefix_cache"] = bool(values["share_prefix_cache"])
    values["priority"] = values["priority"] or DEFAULT_PRIORITY
    if values["max_kv_share"] is not None:
        values["max_kv_share"] = float(values["max_kv_share"])
    if values["models"] is not None:
        values["models"] = tuple(values["models"])
    return EffectivePolicy(**values)


def get_effective_policy(session: Session, user: UserRef | None) -> EffectivePolicy:
    """What applies to `user` now (user None: the default, e.g. for `--no-auth`).

    Read per request, so a policy changed by the admin applies to the very next request.
    """
    default = _stored(_default_row(session), None)
    if user is None:
        return merge_policies(default, None)
    user_id = user if isinstance(user, int) else get_user(session, user).id
    return merge_policies(default, _stored(_user_row(session, user_id), user_id))


def set_policy(session: Session, user: UserRef | None = None, **values: Any) -> StoredPolicy:
    """Change the default policy (user None) or a user's override; only the given fields
    change, and None clears one. Raises ValueError for unknown fields or bad values."""
    validate_policy_fields(values, is_default=user is None)
    if user is None:
        row = _default_row(session)
    else:
        user_id = get_user(session, user).id
        row = _user_row(session, user_id)
        if row is None:
            row = Policy(user_id=user_id)
            session.add(row)
    for name, value in values.items():
        if value is not None and name == "max_kv_share":
            value = float(value)
        elif value is not None and name == "models":
            # Each name once, in the order given: a JSON list, never a tuple (JSON has none).
            value = list(dict.fromkeys(value))
        setattr(row, name, value)
    session.flush()
    record_event(session, "policy_changed", row.user_id,
                 {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()})
    return _stored(row, row.user_id)


def clear_policy(session: Session, user: UserRef) -> bool:
    """Remove a user's override (they then follow the default); False if they had none."""
    row = _user_row(session, get_user(session, user).id)
    if row is None:
        return False
    session.delete(row)
    session.flush()
    record_event(session, "policy_cleared", row.user_id)
    return True


def list_policy_overrides(session: Session) -> dict[str, StoredPolicy]:
    """Every user's override row, by user name (users without one are absent)."""
    rows = session.execute(select(Policy, User.name).join(User, Policy.user_id == User.id)
                           .order_by(User.name))
    return {name: _stored(row, row.user_id) for row, name in rows}
