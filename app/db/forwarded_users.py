"""The people front ends speak for: users made on first sight, found again by the front end's id.

A front-end key says who each request is for (app/admission/forwarded_identity.py decides
how). Here that person becomes, and stays, an ordinary user row: named by their email, else
their name, else the front end's id for them (made into a valid user name), linked to the
front end's user (`via_user_id`), and found again by `forwarded_id`, the SHA-256 of the front
end's stable id for them, so a renamed person is still the same user and the front end's ids
never reach the database in clear (as client thread ids: app/policy/thread_identity.py).
Policies, quotas, usage, threads and disabling then work on them as on anyone.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from officellm.app.db.events import record_event
from officellm.app.db.records import UserInfo
from officellm.app.db.tables import User
from officellm.app.db.users import user_info, validate_user_name

_NOT_NAME_CHARS = re.compile(r"[^A-Za-z0-9._@-]+")
_MAX_NAME = 64
FALLBACK_NAME = "person"


def forwarded_id_digest(stable_id: str) -> str:
    """What is stored of a front end's id for a person: its SHA-256, hex."""
    return hashlib.sha256(stable_id.encode("utf-8")).hexdigest()


def plain_user_name(value: str) -> str | None:
    """`value` made into a valid user name (accents dropped, other characters runs of '-'),
    or None when nothing usable is left. "Zoë Smith" -> "Zoe-Smith"."""
    ascii_only = unicodedata.normalize("NFKD", value).encode("ascii", "ignore").decode()
    name = _NOT_NAME_CHARS.sub("-", ascii_only.strip())
    name = name.lstrip("._@-")[:_MAX_NAME].rstrip("-")
    return name or None


def _free_name(session: Session, base: str) -> str:
    # The name may already be someone else's (a user the admin made, a namesake through
    # another front end): that user is not this person, so this one gets "-2", "-3", ...
    taken = set(session.scalars(
        select(User.name).where((User.name == base) | User.name.startswith(f"{base[:56]}-"))))
    if base not in taken:
        return base
    n = 2
    while True:
        suffix = f"-{n}"
        candidate = base[: _MAX_NAME - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
        n += 1


def find_forwarded_user(session: Session, via_user_id: int, forwarded_id: str) -> UserInfo | None:
    """The user a front end's person already is, or None (read-only: the request path's
    lookup on every request of a front-end key)."""
    user = session.scalar(select(User).where(User.via_user_id == via_user_id,
                                             User.forwarded_id == forwarded_id))
    return user_info(user) if user is not None else None


def add_forwarded_user(session: Session, via_user_id: int, forwarded_id: str,
                       names: Iterable[str | None]) -> UserInfo:
    """The person's user, created now if this is the first sight of them: named by the first
    of `names` (email, name, id) that makes a valid user name. Run it in a write transaction
    (`db.transaction()`): it holds the write lock from its start, so two first requests of one
    person at once make one user, whichever server process they reach."""
    existing = find_forwarded_user(session, via_user_id, forwarded_id)
    if existing is not None:
        return existing
    base = next((p for p in (plain_user_name(n) for n in names if n) if p), FALLBACK_NAME)
    name = validate_user_name(_free_name(session, base))
    user = User(name=name, via_user_id=via_user_id, forwarded_id=forwarded_id)
    session.add(user)
    session.flush()
    via = session.get(User, via_user_id)
    record_event(session, "user_created", user.id,
                 {"name": name, "via": via.name if via is not None else None})
    return user_info(user)
