"""Who is calling: the authenticated caller of a request (a Principal) and, through a front-end
key, that key's grant (a FrontEnd).

A leaf: admission (app/admission/auth.py) makes principals; the layers after it (observability,
serving, the routes) only read them, so they import this module and not the authenticator.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FrontEnd:
    """What an authenticated front-end key may do. `jwt_secret` is the secret its JWTs are
    checked with; `jwt_required` says the key has one, even when it could not be read
    (`secret_problem`): then nothing it sends is believed."""

    key_id: int
    user_id: int  # the front end's own user, e.g. "open-webui"
    name: str
    jwt_required: bool = False
    jwt_secret: str | None = None
    secret_problem: str | None = None


@dataclass(frozen=True)
class Principal:
    """The authenticated caller. `user` is the name that reaches the engine and metrics.

    Through a front-end key, `front_end` is that key's grant: on the key's own principal (it
    may speak for others) and on the principal of each person it speaks for, whose `via` is
    the front end's name ("alice@example.com via open-webui").
    """

    user: str
    user_id: int
    key_id: int | None = None  # the database key used (never the key itself)
    anonymous: bool = False  # --no-auth
    front_end: FrontEnd | None = None
    via: str | None = None
