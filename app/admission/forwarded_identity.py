"""Who a request is for, when a front end such as Open WebUI sends it for one of its people.

Every person behind one Open WebUI shares its one key. A **front-end key**
(`officellm keys issue NAME --forwarded-users`) is trusted to say who each request is for, so
per-user policies, quotas, usage, threads and prefix-cache salts apply to each person
(docs/design.md §5). `decide_identity` is the one place that decides it:

1. On a front-end key with a JWT secret: the `X-OpenWebUI-User-Jwt` header, an HS256 JWT as
   Open WebUI mints it (`sub`, `email`, `name`, `role`, `iss: "open-webui"`, `iat`, `exp`;
   open_webui/utils/headers.py, `_mint_forward_user_jwt`). It must be there and valid: a
   missing, expired, wrongly signed, unsigned or foreign-issuer JWT is refused (401), never
   answered as the front end's own user, which would pool everyone again without a word.
2. Else the plain `X-OpenWebUI-User-Id`, `-Email`, `-Name` headers (Open WebUI's
   ENABLE_FORWARD_USER_INFO_HEADERS without a JWT secret; it URL-quotes the name).
3. Else the request's OpenAI `user` field (LibreChat and other front ends send it).
4. Else nobody: the request is the key's own user's.

On any other key all of this is ignored, and `ignored` says what was sent so the server can
log it once: with their own key nobody can claim to be someone else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote

import jwt

from officellm.app.principal import FrontEnd

# Open WebUI's default header names (open_webui/env.py, FORWARD_USER_INFO_HEADER_*), lower-case
# as HTTP headers compare.
JWT_HEADER = "x-openwebui-user-jwt"
ID_HEADER = "x-openwebui-user-id"
EMAIL_HEADER = "x-openwebui-user-email"
NAME_HEADER = "x-openwebui-user-name"
ROLE_HEADER = "x-openwebui-user-role"
FORWARDED_HEADERS = (JWT_HEADER, ID_HEADER, EMAIL_HEADER, NAME_HEADER, ROLE_HEADER)

JWT_ISSUER = "open-webui"  # the `iss` Open WebUI puts in every forwarded-user JWT
JWT_ALGORITHMS = ["HS256"]  # the only one Open WebUI uses; never "none", never RS/HS confusion
# Open WebUI and officellm may run on two machines whose clocks differ a little.
CLOCK_SKEW_S = 30
# Generous for an id, an email or a name; a longer value is not a person, it is a mistake.
MAX_VALUE_CHARS = 320

Source = Literal["jwt", "headers", "user"]


@dataclass(frozen=True)
class Person:
    """Someone a front end speaks for. `stable_id` is what finds them again (Open WebUI's user
    id, else their email, name or `user` field); the user is named by `names`, first usable."""

    stable_id: str
    email: str | None
    name: str | None
    source: Source

    @property
    def names(self) -> tuple[str | None, ...]:
        """Naming order (docs/design.md §5): email, else name, else the id."""
        return (self.email, self.name, self.stable_id)


@dataclass(frozen=True)
class IdentityDecision:
    """`person` None: the key's own user. `ignored`: forwarded headers an ordinary key sent."""

    person: Person | None
    ignored: tuple[str, ...] = ()


class ForwardedIdentityError(Exception):
    """The front end's word cannot be taken: 401 for what it sent, 500 when this server cannot
    check it (the key's secret file is unreadable)."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def _value(raw: object, what: str) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise ForwardedIdentityError(f"The forwarded {what} is not a string.")
    value = raw.strip()
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate in a JSON `user`
        raise ForwardedIdentityError(f"The forwarded {what} is not valid text.") from exc
    if len(value) > MAX_VALUE_CHARS:
        raise ForwardedIdentityError(f"The forwarded {what} is longer than {MAX_VALUE_CHARS} "
                                     "characters.")
    return value or None


def _from_jwt(token: str | None, secret: str) -> Person:
    if not token:
        raise ForwardedIdentityError(
            "This front-end key needs the person in an X-OpenWebUI-User-Jwt header signed with "
            "its secret (Open WebUI: ENABLE_FORWARD_USER_INFO_HEADERS=True and "
            "FORWARD_USER_INFO_HEADER_JWT_SECRET set to the same secret).")
    try:
        claims = jwt.decode(token, secret, algorithms=JWT_ALGORITHMS, issuer=JWT_ISSUER,
                            leeway=CLOCK_SKEW_S,
                            options={"require": ["sub", "iss", "iat", "exp"]})
    except jwt.ExpiredSignatureError as exc:
        raise ForwardedIdentityError("The X-OpenWebUI-User-Jwt has expired.") from exc
    except jwt.InvalidIssuerError as exc:
        raise ForwardedIdentityError(
            f"The X-OpenWebUI-User-Jwt was not issued by {JWT_ISSUER!r}.") from exc
    except jwt.InvalidSignatureError as exc:
        raise ForwardedIdentityError(
            "The X-OpenWebUI-User-Jwt is not signed with this key's secret.") from exc
    except jwt.PyJWTError as exc:
        raise ForwardedIdentityError(f"The X-OpenWebUI-User-Jwt is not valid: {exc}.") from exc
    sub = _value(claims.get("sub"), "JWT's sub")
    if sub is None:
        raise ForwardedIdentityError("The X-OpenWebUI-User-Jwt names nobody (empty sub).")
    return Person(stable_id=sub, email=_value(claims.get("email"), "JWT's email"),
                  name=_value(claims.get("name"), "JWT's name"), source="jwt")


def _from_headers(headers: Mapping[str, str]) -> Person | None:
    user_id = _value(headers.get(ID_HEADER), "user id")
    email = _value(headers.get(EMAIL_HEADER), "email")
    name = _value(headers.get(NAME_HEADER), "name")
    if name is not None:
        name = unquote(name)  # Open WebUI sends quote(user.name, safe=' ')
    stable = user_id or email or name
    if stable is None:
        return None
    return Person(stable_id=stable, email=email, name=name, source="headers")


def decide_identity(front_end: FrontEnd | None, headers: Mapping[str, str],
                    user_field: str | None) -> IdentityDecision:
    """Who this request is for (see the module's docstring for the order); raises
    ForwardedIdentityError when a front-end key's forwarded identity cannot be trusted.

    `headers` is any mapping with lower-case names (Starlette's Headers is one); `user_field`
    the request body's `user`.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    if front_end is None:
        return IdentityDecision(None, tuple(h for h in FORWARDED_HEADERS if lower.get(h)))
    if front_end.jwt_required:
        if front_end.jwt_secret is None:
            raise ForwardedIdentityError(
                f"This server cannot check the front-end key's JWTs: "
                f"{front_end.secret_problem or 'its secret is missing'}. Issue a new key.", 500)
        return IdentityDecision(_from_jwt(lower.get(JWT_HEADER), front_end.jwt_secret))
    if lower.get(JWT_HEADER):
        # Open WebUI sends the JWT *instead of* the plain headers: ignoring it would pool
        # everyone under the front end's own user without a word.
        raise ForwardedIdentityError(
            "This front-end key has no JWT secret, so its X-OpenWebUI-User-Jwt cannot be "
            "checked: issue the key with --jwt-secret-file, or unset Open WebUI's "
            "FORWARD_USER_INFO_HEADER_JWT_SECRET to send the plain headers.")
    person = _from_headers(lower)
    if person is None:
        user = _value(user_field, "user field")
        if user is not None:
            person = Person(stable_id=user, email=None, name=None, source="user")
    return IdentityDecision(person)
