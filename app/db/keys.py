"""API keys: issue, list, revoke, authenticate.

Keys are `ocl-` + 32 random bytes (urlsafe base64), and only their SHA-256 is stored. A slow
KDF (bcrypt, argon2) exists to stretch low-entropy passwords against guessing; a 256-bit random
key cannot be guessed, fast hash or not, while a slow hash would cost every request tens of
milliseconds. A pepper kept in the same database file would add no secrecy either.

A front-end key (`forwarded_users`) is trusted to say which person each request is for
(docs/design.md §5); it may have a JWT secret, kept apart from the database
(app/db/jwt_secrets.py).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from officellm.app.db.errors import NotFound
from officellm.app.db.events import record_event
from officellm.app.db.jwt_secrets import JwtSecretStore, validate_jwt_secret
from officellm.app.db.records import AuthenticatedUser, IssuedKey, KeyInfo
from officellm.app.db.tables import ApiKey, User
from officellm.app.db.users import UserRef, get_user

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
                   created=key.created, last_used=key.last_used, revoked=key.revoked,
                   forwarded_users=key.forwarded_users, jwt_secret=key.jwt_secret_hash is not None)


def issue_key(session: Session, user: UserRef, *, forwarded_users: bool = False,
              jwt_secret: str | None = None, secrets: JwtSecretStore | None = None) -> IssuedKey:
    """Make a key for `user`; the raw key is in the result and nowhere else, ever.

    `forwarded_users` makes a front-end key; `jwt_secret` (front-end keys only) is stored
    sealed by `secrets`, with its fingerprint. ValueError for a secret that is too short, or
    one given to an ordinary key.
    """
    if jwt_secret is not None:
        if not forwarded_users:
            raise ValueError("a JWT secret is for a front-end key: add forwarded_users "
                             "(--forwarded-users)")
        if secrets is None:
            raise ValueError("no place to keep the JWT secret was given")
        jwt_secret = validate_jwt_secret(jwt_secret)
    owner = get_user(session, user)
    if owner.via_user_id is not None:
        # A person a front end speaks for may get a key of their own, but not one that speaks
        # for others: front ends are accounts the admin made for them.
        if forwarded_users:
            raise ValueError(f"{owner.name} came through a front end; make the front-end key "
                             "for the front end's own user")
    raw = generate_key()
    key = ApiKey(user_id=owner.id, key_hash=hash_key(raw), prefix=raw[:SHOWN_PREFIX_LEN],
                 forwarded_users=forwarded_users)
    session.add(key)
    session.flush()
    if jwt_secret is not None:
        assert secrets is not None
        key.jwt_secret_hash, key.jwt_secret_sealed = secrets.seal(session, jwt_secret)
        session.flush()
    record_event(session, "key_issued", owner.id,
                 {"key_id": key.id, "prefix": key.prefix, "forwarded_users": forwarded_users,
                  "jwt_secret": jwt_secret is not None})
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


def get_key(session: Session, prefix_or_id: str | int) -> KeyInfo:
    """A key's record by id or shown prefix (find_key's rules); never its secrets."""
    key = find_key(session, prefix_or_id)
    return _info(key, get_user(session, key.user_id).name)


def revoke_key(session: Session, prefix_or_id: str | int,
               secrets: JwtSecretStore | None = None) -> KeyInfo:
    """Revoke a key: authenticate() refuses it from the next request on. Its sealed JWT
    secret, if any, is dropped (and an old secret file deleted from `secrets`): nothing will
    check a signature with it again."""
    key = find_key(session, prefix_or_id)
    if not key.revoked:
        key.revoked = True
        record_event(session, "key_revoked", key.user_id, {"key_id": key.id, "prefix": key.prefix})
    key.jwt_secret_sealed = None
    session.flush()
    if secrets is not None and key.jwt_secret_hash is not None:
        secrets.forget_file(key.id)
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
        select(ApiKey.id, ApiKey.key_hash, ApiKey.revoked, ApiKey.forwarded_users,
               ApiKey.jwt_secret_hash, ApiKey.jwt_secret_sealed, User.id, User.name,
               User.disabled)
        .join(User, ApiKey.user_id == User.id)
        .where(ApiKey.key_hash == digest)
    ).first()
    if row is None:
        return None
    key_id, stored, revoked, forwarded_users, secret_hash, sealed, user_id, name, disabled = row
    if not hmac.compare_digest(stored, digest) or revoked or disabled:
        return None
    return AuthenticatedUser(user_id=user_id, name=name, key_id=key_id,
                             forwarded_users=bool(forwarded_users), jwt_secret_hash=secret_hash,
                             jwt_secret_sealed=sealed)


def touch_keys(session: Session, last_used: dict[int, datetime]) -> None:
    """Set last_used for many keys at once (the batched writer's flush)."""
    for key_id, when in last_used.items():
        session.execute(
            update(ApiKey)
            .where(ApiKey.id == key_id, (ApiKey.last_used.is_(None)) | (ApiKey.last_used < when))
            .values(last_used=when)
        )
