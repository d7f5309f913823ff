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

A front-end key (Open WebUI, ...) speaks for other people: `get_caller` turns its principal into
the person's, made a user on first sight (app/admission/forwarded_identity.py decides who;
app/db/forwarded_users.py keeps them).
"""

from __future__ import annotations

import hmac
import logging
import threading
from typing import Protocol

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from officellm.app.admission.forwarded_identity import (
    ForwardedIdentityError,
    Person,
    decide_identity,
)
from officellm.app.db import Database, authenticate, ensure_user, get_user
from officellm.app.db.errors import NotFound
from officellm.app.db.forwarded_users import (
    add_forwarded_user,
    find_forwarded_user,
    forwarded_id_digest,
)
from officellm.app.db.jwt_secrets import SecretUnavailable
from officellm.app.db.keys import KEY_PREFIX
from officellm.app.db.records import AuthenticatedUser
from officellm.app.errors import APIError
from officellm.app.principal import FrontEnd, Principal

logger = logging.getLogger("officellm.server")

DESK_USER = "local"


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
        self._noted: set[int] = set()
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
                    return Principal(who.name, who.user_id, key_id=who.key_id,
                                     front_end=self._front_end(who))
            number = self._static.match(token) if self._static else None
            if number is None:
                return None
            try:
                user = get_user(session, f"key{number}")
            except NotFound:  # deleted by hand since start-up
                return None
            # A static key's user can be disabled by the admin like any other.
            return None if user.disabled else Principal(user.name, user.id)


    def _front_end(self, who: AuthenticatedUser) -> FrontEnd | None:
        """A front-end key's grant, with its JWT secret read (and checked) once per run."""
        if not who.forwarded_users:
            return None
        if who.jwt_secret_hash is None:
            return FrontEnd(who.key_id, who.user_id, who.name)
        try:
            secret = self._db.jwt_secrets.load(who.key_id, who.jwt_secret_hash,
                                               who.jwt_secret_sealed)
        except SecretUnavailable as exc:
            if who.key_id not in self._noted:  # every request would say it again
                self._noted.add(who.key_id)
                logger.error("Front-end key %d (%s): %s; its requests are refused until a new "
                             "key is issued", who.key_id, who.name, exc)
            return FrontEnd(who.key_id, who.user_id, who.name, jwt_required=True,
                            secret_problem=str(exc))
        return FrontEnd(who.key_id, who.user_id, who.name, jwt_required=True, jwt_secret=secret)


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


def api_key(request: Request) -> str | None:
    """The caller's key: `Authorization: Bearer <key>` (OpenAI's clients), else `x-api-key`
    (Anthropic's clients and Claude Code send their key there)."""
    token = bearer_token(request)
    if token is None:
        token = (request.headers.get("x-api-key") or "").strip() or None
    return token


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
    return APIError(401, "Incorrect or missing API key. Send 'Authorization: Bearer <key>' "
                         "(or 'x-api-key: <key>').",
                    code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


async def get_principal(request: Request) -> Principal:
    """FastAPI dependency: the caller, or 401 in OpenAI's shape.

    The lookup is a quick indexed SQLite read, run on a worker thread so the event loop
    never waits on the database.
    """
    check_throttle(request)
    authenticator: Authenticator = request.app.state.authenticator
    token = api_key(request)
    principal = await run_in_threadpool(authenticator.authenticate, token)
    if principal is None:
        if token is not None:  # a guess; a missing key guesses nothing
            record_auth_failure(request)
        raise unauthorized()
    if principal.key_id is not None:
        request.app.state.server.accounts.touch_key(principal.key_id)
    if principal.front_end is not None:
        # Front ends show error bodies their own way: app/error_handlers.py reads this.
        request.state.front_end = True
    return principal


class ForwardedPeople:
    """The people front-end keys speak for, as principals: found by the front end's id for
    them, made users on first sight, refused when the admin disabled them. One per app."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._noted: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def principal(self, key: Principal, person: Person) -> Principal | None:
        """The person's principal, or None if the admin disabled them (blocking: database)."""
        front_end = key.front_end
        assert front_end is not None
        forwarded_id = forwarded_id_digest(person.stable_id)
        # Read first: every request after a person's first is one indexed lookup, no write.
        with self._db.session() as session:
            user = find_forwarded_user(session, front_end.user_id, forwarded_id)
        if user is None:
            # The one write on the request path outside the batched writer: the person needs
            # an id before their first request can be admitted, and it happens once per person.
            with self._db.transaction() as session:
                user = add_forwarded_user(session, front_end.user_id, forwarded_id, person.names)
            logger.info("New user %s via %s (from its %s)", user.name, front_end.name,
                        person.source)
        if user.disabled:
            return None
        return Principal(user.name, user.id, key_id=key.key_id, front_end=front_end,
                         via=front_end.name)

    def note_once(self, who: Principal, what: str, message: str) -> None:
        """Log `message` at WARNING the first time `who` causes `what` in this run: a front end
        or client that keeps doing it would otherwise fill the log with one line per request."""
        with self._lock:
            if (who.user, what) in self._noted:
                return
            self._noted.add((who.user, what))
        logger.warning("%s", message)


async def get_caller(request: Request, principal: Principal, user_field: str | None) -> Principal:
    """Who a generation request runs as (docs/design.md §5): on a front-end key, the person it
    forwards (401 if a JWT it must send is missing or bad; 403 for a person the admin
    disabled); on any other key its own user, whatever forwarded headers it sent (ignored,
    and logged once). `user_field` is the body's OpenAI `user`."""
    people: ForwardedPeople = request.app.state.people
    try:
        decision = decide_identity(principal.front_end, request.headers, user_field)
    except ForwardedIdentityError as exc:
        request.app.state.server.refusals.server_limit(principal, "forwarded_identity")
        people.note_once(principal, exc.message,
                         f"Refused a request of front-end key {principal.key_id} "
                         f"({principal.user}): {exc.message}")
        raise APIError(exc.status, exc.message,
                       code="invalid_forwarded_user" if exc.status == 401 else "internal_error",
                       headers={"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
                       ) from exc
    if decision.ignored:
        people.note_once(principal, "ignored", (
            f"{principal.user} sent {', '.join(decision.ignored)}, ignored: only a front-end key "
            "speaks for other people (officellm keys issue NAME --forwarded-users)"))
    if decision.person is None:
        return principal
    person = await run_in_threadpool(people.principal, principal, decision.person)
    if person is None:
        raise APIError(403, "Your account on this server is disabled; ask its administrator.",
                       code="user_disabled", type="permission_error")
    return person
