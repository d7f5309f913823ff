"""Who is calling: a FastAPI dependency returning a Principal.

Every principal is a user row in the database (docs/design.md §5, §7), so policies, quotas, usage and
threads work the same for all of them:
- per-user keys issued by the admin (`ocl-...`, stored as SHA-256, looked up by hash and
  checked in constant time: app.db.authenticate);
- `--api-key` static keys, key i (from 1) being the user "key<i>";
- `--no-auth` (single-user desk mode): every request is the local user "local".
A revoked key or a disabled user is refused from the very next request: nothing is cached.
Refused tokens are counted per client address (app/admission/auth_throttle.py): too many, and that
address gets 429 with Retry-After for a while.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Protocol

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from app.db import Database, authenticate, ensure_user, get_user
from app.db.errors import NotFound
from app.db.keys import KEY_PREFIX
from app.openai.errors import APIError

DESK_USER = "local"


@dataclass(frozen=True)
class Principal:
    """The authenticated caller. `user` is the name that reaches the engine and metrics."""

    user: str
    user_id: int
    key_id: int | None = None  # the database key used (never the key itself)
    anonymous: bool = False  # --no-auth


class Authenticator(Protocol):
    """Maps a bearer token (or None) to a Principal, or None when the token is refused.

    Blocking (database reads): call it from a worker thread, as get_principal does.
    """

    def authenticate(self, token: str | None) -> Principal | None: ...


class DeskAuthenticator:
    """--no-auth: everyone is the local desk user, whatever they send."""

    def __init__(self, db: Database) -> None:
        self._db = db
        with db.transaction() as session:
            self._user_id = ensure_user(session, DESK_USER).id

    def authenticate(self, token: str | None) -> Principal | None:
        return Principal(DESK_USER, self._user_id, anonymous=True)


class StaticKeys:
    """Keys given on the command line, compared in constant time against every one of them."""

    def __init__(self, keys: list[str]) -> None:
        self._keys = [k.encode() for k in keys]

    def match(self, token: str) -> int | None:
        """The key's number (from 1), or None."""
        given = token.encode()
        found = None
        # Compare against every key so timing does not reveal which one matched.
        for i, key in enumerate(self._keys, start=1):
            if hmac.compare_digest(given, key) and found is None:
                found = i
        return found

    def __bool__(self) -> bool:
        return bool(self._keys)


class DatabaseAuthenticator:
    """Per-user keys from the database, plus the static `--api-key` keys."""

    def __init__(self, db: Database, static_keys: list[str] | None = None) -> None:
        self._db = db
        self._static = StaticKeys(static_keys or [])
        if self._static:
            # Make their users now, so a request never writes on the auth path.
            with db.transaction() as session:
                for i in range(1, len(static_keys or []) + 1):
                    ensure_user(session, f"key{i}")

    def authenticate(self, token: str | None) -> Principal | None:
        if not token:
            return None
        with self._db.session() as session:
            if token.startswith(KEY_PREFIX):
                who = authenticate(session, token)
                if who is not None:
                    return Principal(who.name, who.user_id, key_id=who.key_id)
            number = self._static.match(token) if self._static else None
            if number is None:
                return None
            try:
                user = get_user(session, f"key{number}")
            except NotFound:  # deleted by hand since start-up
                return None
            # A static key's user can be disabled by the admin like any other.
            return None if user.disabled else Principal(user.name, user.id)


def make_authenticator(db: Database, api_keys: list[str], no_auth: bool) -> Authenticator:
    """The authenticator for the flags."""
    if no_auth:
        if api_keys:
            raise ValueError("--no-auth and --api-key contradict each other; give one.")
        return DeskAuthenticator(db)
    return DatabaseAuthenticator(db, api_keys)


def bearer_token(request: Request) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, if any."""
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def client_address(request: Request) -> str | None:
    """The peer's IP address as uvicorn saw it (the throttle's key)."""
    return request.client.host if request.client else None


def check_throttle(request: Request) -> None:
    """429 with Retry-After if the caller's address failed authentication too often lately."""
    server = request.app.state.server
    try:
        server.auth_throttle.check(client_address(request))
    except APIError:
        server.metrics.auth_throttled.inc()
        raise


def record_auth_failure(request: Request) -> None:
    """Count a refused token against the caller's address (and in officellm:auth_failures)."""
    server = request.app.state.server
    server.metrics.auth_failures.inc()
    server.auth_throttle.failed(client_address(request))


def unauthorized() -> APIError:
    return APIError(401, "Incorrect or missing API key. Send 'Authorization: Bearer <key>'.",
                    code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


async def get_principal(request: Request) -> Principal:
    """FastAPI dependency: the caller, or 401 in OpenAI's shape.

    The lookup is a quick indexed SQLite read, run on a worker thread so the event loop
    never waits on the database.
    """
    check_throttle(request)
    authenticator: Authenticator = request.app.state.authenticator
    token = bearer_token(request)
    principal = await run_in_threadpool(authenticator.authenticate, token)
    if principal is None:
        if token is not None:  # a guess; a missing key guesses nothing
            record_auth_failure(request)
        raise unauthorized()
    if principal.key_id is not None:
        request.app.state.server.accounts.touch_key(principal.key_id)
    return principal
