"""Who is calling: a FastAPI dependency returning a Principal.

Today keys come from `--api-key` flags; the policies issue replaces the Authenticator with
DB-backed per-user keys (hashes in SQLite) without touching the routes, which only ever see
`Depends(get_principal)`.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Protocol

from fastapi import Request

from app.errors import APIError

ANONYMOUS_USER = "anonymous"


@dataclass(frozen=True)
class Principal:
    """The authenticated caller. `user` is the name that reaches the engine and metrics."""

    user: str
    key_id: str | None = None  # which key (never the key itself); None when anonymous
    anonymous: bool = False


class Authenticator(Protocol):
    """Maps a bearer token (or None) to a Principal, or None when the token is refused."""

    def authenticate(self, token: str | None) -> Principal | None: ...


class AnonymousAuthenticator:
    """--no-auth (single-user desk mode): everyone is the anonymous user."""

    def authenticate(self, token: str | None) -> Principal | None:
        return Principal(ANONYMOUS_USER, anonymous=True)


class StaticKeyAuthenticator:
    """Keys given on the command line; the i-th key (from 1) authenticates user "key<i>"."""

    def __init__(self, keys: list[str]) -> None:
        if not keys:
            raise ValueError("StaticKeyAuthenticator needs at least one key.")
        self._keys = [k.encode() for k in keys]

    def authenticate(self, token: str | None) -> Principal | None:
        if token is None:
            return None
        given = token.encode()
        found = None
        # Compare against every key in constant time so timing does not reveal which matched.
        for i, key in enumerate(self._keys, start=1):
            if hmac.compare_digest(given, key) and found is None:
                found = i
        return None if found is None else Principal(f"key{found}", key_id=f"key{found}")


def make_authenticator(api_keys: list[str]) -> Authenticator:
    """The authenticator for the flags: keys given -> StaticKeyAuthenticator, else anonymous."""
    return StaticKeyAuthenticator(api_keys) if api_keys else AnonymousAuthenticator()


def bearer_token(request: Request) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, if any."""
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


async def get_principal(request: Request) -> Principal:
    """FastAPI dependency: the caller, or 401 in OpenAI's shape."""
    authenticator: Authenticator = request.app.state.authenticator
    principal = authenticator.authenticate(bearer_token(request))
    if principal is None:
        raise APIError(401, "Incorrect or missing API key. Send 'Authorization: Bearer <key>'.",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    return principal
