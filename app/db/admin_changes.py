"""The admin's changes to users, keys, policies and the model registry, each with its audit
row (app/db/audit.py) in the same transaction: the admin API (app/admin/) and the CLI's
direct database commands (cli/) both change things through these, so every change is
recorded the same way whichever way it came.

Each function takes the session of the caller's transaction and the actor; what a change's
before and after hold is decided here, once per kind of thing."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from officellm.app.db import keys, policies, registered_models, users
from officellm.app.db.audit import record_change
from officellm.app.db.jwt_secrets import JwtSecretStore
from officellm.app.db.policies import StoredPolicy
from officellm.app.db.records import IssuedKey, KeyInfo, UserInfo
from officellm.app.db.users import UserRef
from officellm.app.registry.entry import ModelEntry

# The target of a change to the default policy (a user's name otherwise).
DEFAULT_POLICY_TARGET = "default"


def user_values(user: UserInfo) -> dict[str, Any]:
    """A user as the audit log records them."""
    return user.to_dict()


def key_values(key: KeyInfo) -> dict[str, Any]:
    """A key as the audit log records it: its id, owner, kind, shown prefix and state; never
    the key, its hash or its JWT secret (KeyInfo holds none of them). last_used is left out:
    it is use, not a change."""
    values = key.to_dict()
    del values["last_used"]
    return values


def policy_values(policy: StoredPolicy) -> dict[str, Any]:
    """A stored policy row as the audit log records it."""
    return policy.to_dict()


def model_values(entry: ModelEntry) -> dict[str, Any]:
    """A registry entry as the audit log records it."""
    return entry.to_dict()


def create_user(session: Session, actor: str, name: str) -> UserInfo:
    """users.create_user, recorded as user.create."""
    user = users.create_user(session, name)
    record_change(session, actor, "user.create", user.name, None, user_values(user))
    return user


def set_user_disabled(session: Session, actor: str, ref: UserRef, disabled: bool) -> UserInfo:
    """users.set_user_disabled, recorded as user.disable or user.enable."""
    before = users.user_info(users.get_user(session, ref))
    after = users.set_user_disabled(session, ref, disabled)
    record_change(session, actor, "user.disable" if disabled else "user.enable", after.name,
                  user_values(before), user_values(after))
    return after


def delete_user(session: Session, actor: str, ref: UserRef,
                before: UserInfo | None = None) -> UserInfo:
    """users.delete_user, recorded as user.delete; `before` is the user as the admin found
    them when the deletion first disabled them (app/admin/users.py), if it did."""
    deleted = users.delete_user(session, ref)
    record_change(session, actor, "user.delete", deleted.name,
                  user_values(before or deleted), None)
    return deleted


def issue_key(session: Session, actor: str, user: UserRef, *, forwarded_users: bool = False,
              jwt_secret: str | None = None, secrets: JwtSecretStore | None = None
              ) -> IssuedKey:
    """keys.issue_key, recorded as key.issue (the raw key is in the result only)."""
    issued = keys.issue_key(session, user, forwarded_users=forwarded_users,
                            jwt_secret=jwt_secret, secrets=secrets)
    record_change(session, actor, "key.issue", str(issued.info.id), None,
                  key_values(issued.info))
    return issued


def revoke_key(session: Session, actor: str, prefix_or_id: str | int,
               secrets: JwtSecretStore | None = None) -> KeyInfo:
    """keys.revoke_key, recorded as key.revoke."""
    before = keys.get_key(session, prefix_or_id)
    after = keys.revoke_key(session, prefix_or_id, secrets=secrets)
    record_change(session, actor, "key.revoke", str(after.id), key_values(before),
                  key_values(after))
    return after


def _policy_target(session: Session, user: UserRef | None) -> str:
    return DEFAULT_POLICY_TARGET if user is None else users.get_user(session, user).name


def set_policy(session: Session, actor: str, user: UserRef | None = None,
               **values: Any) -> StoredPolicy:
    """policies.set_policy, recorded as policy.set (target: the user, or "default")."""
    target = _policy_target(session, user)
    before = policies.get_policy(session, user)
    after = policies.set_policy(session, user, **values)
    record_change(session, actor, "policy.set", target, policy_values(before),
                  policy_values(after))
    return after


def clear_policy(session: Session, actor: str, user: UserRef) -> bool:
    """policies.clear_policy, recorded as policy.clear when there was an override."""
    target = _policy_target(session, user)
    before = policies.get_policy(session, user)
    removed = policies.clear_policy(session, user)
    if removed:
        record_change(session, actor, "policy.clear", target, policy_values(before), None)
    return removed


def add_model(session: Session, actor: str, entry: ModelEntry) -> None:
    """registered_models.add_entry, recorded as model.add."""
    registered_models.add_entry(session, entry)
    record_change(session, actor, "model.add", entry.name, None, model_values(entry))


def change_model(session: Session, actor: str, name: str, **changes: Any) -> ModelEntry | None:
    """registered_models.update_entry, recorded as model.change (None, and no row, when no
    model has that name)."""
    before = registered_models.get_entry(session, name)
    after = registered_models.update_entry(session, name, **changes)
    if before is not None and after is not None:
        record_change(session, actor, "model.change", name, model_values(before),
                      model_values(after))
    return after


def remove_model(session: Session, actor: str, name: str) -> bool:
    """registered_models.remove_entry, recorded as model.remove (False, and no row, when no
    model has that name)."""
    before = registered_models.get_entry(session, name)
    removed = registered_models.remove_entry(session, name)
    if before is not None and removed:
        record_change(session, actor, "model.remove", name, model_values(before), None)
    return removed
