"""API keys: issue, list, revoke, authenticate.

Keys are `ocl-` + 32 random bytes (urlsafe base64), and only their SHA-256 is stored. A slow
KDF (bcrypt, argon2) exists to stretch low-entropy passwords against guessing; a 256-bit random
key cannot be guessed, fast hash or not, while a slow hash would cost every request tens of
milliseconds. A pepper kept in the same database file would add no secrecy either.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.db.errors import NotFound
from app.db.events import record_event
from app.db.records import AuthenticatedUser, IssuedKey, KeyInfo
from app.db.tables import ApiKey, User
from app.db.users import UserRef, get_user

KEY_PREFIX = "ocl-"
# "ocl-" + 8 characters (48 random bits) shown to admins: enough to tell keys apart, far too
# little to help guess the remaining 208 bits.
SHOWN_PREFIX_LEN = 12
_RAW_KEY_LEN = len(KEY_PREFIX) + 43  # token_urlsafe(32) is 43 characters


def generate_key() -> str:
    """A new raw API key."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(raw: str) -> str:
    """The stored form of a key (hex SHA-256)."""
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def _info(key: ApiKey, user_name: str) -> KeyInfo:
    return KeyInfo(id=key.id, user_id=key.user_id, user_name=user_name, prefix=key.prefix,
                   created=key.created, last_used=key.last_used, revoked=key.revoked)


def issue_key(session: Session, user: UserRef) -> IssuedKey:
    """Make a key for `user`; the raw key is in the result and nowhere else, ever."""
    owner = get_user(session, user)
    raw = generate_key()
    key = ApiKey(user_id=owner.id, key_hash=hash_key(raw), prefix=raw[:SHOWN_PREFIX_LEN])
    session.add(key)
    session.flush()
    record_event(session, "key_issued", owner.id, {"key_id": key.id, "prefix": key.prefix})
    return IssuedKey(raw=raw, info=_info(key, owner.name))


def list_keys(session: Session, user: UserRef | None = None) -> list[KeyInfo]:
    """Keys (all, or one user's), oldest first; never the secrets."""
    stmt = select(ApiKey, User.name).join(User, ApiKey.user_id == User.id).order_by(ApiKey.id)
    if user is not None:
        stmt = stmt.where(ApiKey.user_id == get_user(session, user).id)
    return [_info(k, name) for k, name in session.execute(stmt)]


def find_key(session: Session, prefix_or_id: str | int) -> ApiKey:
    """A key by id (digits) or by its shown prefix; NotFound, or ValueError if ambiguous."""
    ref = str(prefix_or_id)
    if ref.isdigit():
        key = session.get(ApiKey, int(ref))
        if key is None:
            raise NotFound(f"no key with id {ref}")
        return key
    if len(ref) < len(KEY_PREFIX) + 2:
        raise ValueError(f"key prefix {ref!r} is too short to pick one key")
    matches = session.scalars(
        select(ApiKey).where(ApiKey.prefix.startswith(ref[:SHOWN_PREFIX_LEN], autoescape=True))
    ).all()
    if not matches:
        raise NotFound(f"no key with prefix {ref!r}")
    if len(matches) > 1:
        ids = ", ".join(str(k.id) for k in matches)
        raise ValueError(f"prefix {ref!r} matches several keys (ids {ids}); give the id")
    return matches[0]


def revoke_key(session: Session, prefix_or_id: str | int) -> KeyInfo:
    """Revoke a key: authenticate() refuses it from the next request on."""
    key = find_key(session, prefix_or_id)
    if not key.revoked:
        key.revoked = True
        record_event(session, "key_revoked", key.user_id, {"key_id": key.id, "prefix": key.prefix})
    session.flush()
    return _info(key, get_user(session, key.user_id).name)


def authenticate(session: Session, raw_key: str) -> AuthenticatedUser | None:
    """The user a raw key belongs to, or None (unknown, revoked, or the user is disabled).

    Read-only: record last_used through the batched writer (UsageWriter.touch_key), not here.
    """
    if not raw_key.startswith(KEY_PREFIX) or len(raw_key) != _RAW_KEY_LEN:
        return None
    digest = hash_key(raw_key)
    # The index lookup compares hashes in non-constant time, which is harmless: timing could at
    # most reveal the hash of the attacker's own guess. compare_digest guards the final check.
    row = session.execute(
        select(ApiKey.id, ApiKey.key_hash, ApiKey.revoked, User.id, User.name, User.disabled)
        .join(User, ApiKey.user_id == User.id)
        .where(ApiKey.key_hash == digest)
    ).first()
    if row is None:
        return None
    key_id, stored, revoked, user_id, name, disabled = row
    if not hmac.compare_digest(stored, digest) or revoked or disabled:
        return None
    return AuthenticatedUser(user_id=user_id, name=name, key_id=key_id)


def touch_keys(session: Session, last_used: dict[int, datetime]) -> None:
    """Set last_used for many keys at once (the batched writer's flush)."""
    for key_id, when in last_used.items():
        session.execute(
            update(ApiKey)
            .where(ApiKey.id == key_id, (ApiKey.last_used.is_(None)) | (ApiKey.last_used < when))
            .values(last_used=when)
        )
