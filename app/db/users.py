"""Users: create, list, disable, delete, look up."""

from __future__ import annotations

import re
from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from officellm.app.db.errors import AlreadyExists, NotFound
from officellm.app.db.events import record_event
from officellm.app.db.records import UserInfo
from officellm.app.db.tables import User

# Names appear in CLI arguments, metrics labels and log lines: keep them plain.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")

UserRef = int | str  # a user's id or name


def user_info(user: User) -> UserInfo:
    """The session-free view of a User row (reads its front end's name, if any)."""
    return UserInfo(id=user.id, name=user.name, disabled=user.disabled, created=user.created,
                    via=user.via.name if user.via is not None else None)


def validate_user_name(name: str) -> str:
    """Return `name` if usable as a user name, else raise ValueError saying why."""
    if not _NAME_RE.match(name):
        raise ValueError(f"invalid user name {name!r}: use 1-64 letters, digits, '.', '_', '@' "
                         "or '-', starting with a letter or digit")
    return name


def get_user(session: Session, ref: UserRef) -> User:
    """The User row for an id or a name; NotFound if there is none."""
    if isinstance(ref, int):
        user = session.get(User, ref)
    else:
        user = session.scalar(select(User).where(User.name == ref))
    if user is None:
        raise NotFound(f"no user {ref!r}")
    return user


def create_user(session: Session, name: str) -> UserInfo:
    """Add a user; AlreadyExists if the name is taken."""
    validate_user_name(name)
    if session.scalar(select(User.id).where(User.name == name)) is not None:
        raise AlreadyExists(f"user {name!r} already exists")
    user = User(name=name)
    session.add(user)
    session.flush()
    record_event(session, "user_created", user.id, {"name": name})
    return user_info(user)


def ensure_user(session: Session, name: str) -> UserInfo:
    """The user called `name`, created if missing (e.g. the desk user of `--no-auth`)."""
    user = session.scalar(select(User).where(User.name == name))
    return user_info(user) if user is not None else create_user(session, name)


def list_users(session: Session) -> list[UserInfo]:
    """Every user, by name."""
    stmt = select(User).options(selectinload(User.via)).order_by(User.name)
    return [user_info(u) for u in session.scalars(stmt)]


def set_user_disabled(session: Session, ref: UserRef, disabled: bool = True) -> UserInfo:
    """Disable (or re-enable) a user: a disabled user's keys stop authenticating at once."""
    user = get_user(session, ref)
    if user.disabled != disabled:
        user.disabled = disabled
        record_event(session, "user_disabled" if disabled else "user_enabled", user.id)
    session.flush()
    return user_info(user)


def delete_user(session: Session, ref: UserRef) -> UserInfo:
    """Delete a user and, with them, their keys, policy, threads and usage (the schema's
    ON DELETE CASCADE); events keep their rows without the id. The id is never given to
    another user (migrations/versions/0009). Their cached context is the caller's to purge
    first (app/admin/users.py): it is keyed by the id."""
    user = get_user(session, ref)
    info = user_info(user)
    record_event(session, "user_deleted", user.id, {"name": user.name})
    session.flush()  # the event first: the delete then clears its user_id (ON DELETE SET NULL)
    session.delete(user)
    session.flush()
    return info


def disable_user(session: Session, ref: UserRef) -> UserInfo:
    """Disable a user (their keys stay, but authenticate() refuses them)."""
    return set_user_disabled(session, ref, True)


def user_names(session: Session, user_ids: Iterable[int]) -> dict[int, str]:
    """Names of these users (ids of users that no longer exist are absent)."""
    ids = set(user_ids)
    if not ids:
        return {}
    return dict(session.execute(select(User.id, User.name).where(User.id.in_(ids))).all())
