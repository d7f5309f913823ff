"""decide_identity: who a request is for, one rule per test (app/admission/forwarded_identity.py).

JWTs are minted with PyJWT as Open WebUI 0.12.4 mints them (open_webui/utils/headers.py,
`_mint_forward_user_jwt`: HS256; sub, email, name, role, iss "open-webui", iat, exp).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import jwt
import pytest

from officellm.app.admission.forwarded_identity import (
    ForwardedIdentityError,
    decide_identity,
)
from officellm.app.principal import FrontEnd

SECRET = "a-secret-of-more-than-thirty-two-characters"
PLAIN = FrontEnd(key_id=1, user_id=10, name="open-webui")
SIGNED = FrontEnd(key_id=2, user_id=11, name="open-webui", jwt_required=True, jwt_secret=SECRET)


def mint(secret: str = SECRET, expires_s: int = 300, **override: Any) -> str:
    now = int(time.time())
    payload = {"sub": "u-1", "email": "alice@example.com", "name": "Alice", "role": "user",
               "iss": "open-webui", "iat": now, "exp": now + expires_s, **override}
    return jwt.encode(payload, secret, algorithm="HS256")


def headers(**values: str) -> dict[str, str]:
    return {f"x-openwebui-user-{k}": v for k, v in values.items()}


def test_a_verified_jwt_names_the_person() -> None:
    person = decide_identity(SIGNED, {"x-openwebui-user-jwt": mint()}, None).person
    assert person is not None
    assert (person.stable_id, person.email, person.name, person.source) == (
        "u-1", "alice@example.com", "Alice", "jwt")


def test_header_names_compare_case_insensitively() -> None:
    person = decide_identity(SIGNED, {"X-OpenWebUI-User-Jwt": mint()}, None).person
    assert person is not None and person.stable_id == "u-1"


def _unsigned() -> str:
    return jwt.encode({"sub": "u-1", "iss": "open-webui", "iat": int(time.time()),
                       "exp": int(time.time()) + 60}, None, algorithm="none")


# Tokens are minted when the test runs, not at collection: a slow session (or another test
# order) must not turn a "not issued by" token into an expired one.
@pytest.mark.parametrize("make_token, words", [
    (lambda: mint(secret="another-secret-of-more-than-32-chars"),
     "not signed with this key's secret"),
    (lambda: mint(expires_s=-600), "expired"),
    (lambda: mint(iss="not-open-webui"), "not issued by"),
    (_unsigned, "not valid"),
    (lambda: mint(sub=""), "names nobody"),
    (lambda: "not.a.jwt", "not valid"),
], ids=["wrong-secret", "expired", "wrong-issuer", "unsigned", "no-subject", "not-a-jwt"])
def test_a_bad_jwt_is_refused_with_401(make_token: Callable[[], str], words: str) -> None:
    with pytest.raises(ForwardedIdentityError) as refused:
        decide_identity(SIGNED, {"x-openwebui-user-jwt": make_token()}, None)
    assert refused.value.status == 401 and words in refused.value.message


def test_a_jwt_without_exp_is_refused() -> None:
    token = jwt.encode({"sub": "u-1", "iss": "open-webui", "iat": int(time.time())}, SECRET,
                       algorithm="HS256")
    with pytest.raises(ForwardedIdentityError):
        decide_identity(SIGNED, {"x-openwebui-user-jwt": token}, None)


def test_a_key_with_a_secret_takes_no_plain_headers_nor_user_field() -> None:
    with pytest.raises(ForwardedIdentityError) as refused:
        decide_identity(SIGNED, headers(id="u-1", email="alice@example.com"), "alice")
    assert "X-OpenWebUI-User-Jwt" in refused.value.message


def test_a_little_clock_skew_is_forgiven() -> None:
    assert decide_identity(SIGNED, {"x-openwebui-user-jwt": mint(expires_s=-10)},
                           None).person is not None


def test_an_unreadable_secret_refuses_with_500() -> None:
    broken = FrontEnd(key_id=3, user_id=12, name="owui", jwt_required=True,
                      secret_problem="the file is gone")
    with pytest.raises(ForwardedIdentityError) as refused:
        decide_identity(broken, {"x-openwebui-user-jwt": mint()}, None)
    assert refused.value.status == 500 and "the file is gone" in refused.value.message


def test_plain_headers_name_the_person_and_the_name_is_unquoted() -> None:
    sent = headers(id="u-2", email="zoe@example.com", name=quote("Zoë Smith", safe=" "),
                   role="user")
    person = decide_identity(PLAIN, sent, None).person
    assert person is not None
    assert (person.stable_id, person.email, person.name, person.source) == (
        "u-2", "zoe@example.com", "Zoë Smith", "headers")


def test_headers_without_an_id_are_found_by_email() -> None:
    person = decide_identity(PLAIN, headers(email="bob@example.com"), None).person
    assert person is not None and person.stable_id == "bob@example.com"


def test_headers_come_before_the_user_field() -> None:
    person = decide_identity(PLAIN, headers(id="u-3"), "someone-else").person
    assert person is not None and person.stable_id == "u-3"


def test_the_user_field_names_the_person_without_headers() -> None:
    person = decide_identity(PLAIN, {}, "carol@example.com").person
    assert person is not None
    assert (person.stable_id, person.source, person.names) == (
        "carol@example.com", "user", (None, None, "carol@example.com"))


def test_nothing_forwarded_is_the_key_itself() -> None:
    assert decide_identity(PLAIN, {"x-openwebui-user-role": ""}, "  ").person is None


def test_a_jwt_to_a_key_without_a_secret_is_refused_not_ignored() -> None:
    with pytest.raises(ForwardedIdentityError) as refused:
        decide_identity(PLAIN, {"x-openwebui-user-jwt": mint()}, None)
    assert "--jwt-secret-file" in refused.value.message


def test_an_ordinary_key_ignores_and_reports_forwarded_headers() -> None:
    decision = decide_identity(None, {**headers(id="u-1", email="boss@example.com"),
                                      "x-openwebui-user-jwt": mint()}, "boss")
    assert decision.person is None
    assert set(decision.ignored) == {"x-openwebui-user-jwt", "x-openwebui-user-id",
                                     "x-openwebui-user-email"}


def test_an_overlong_value_is_refused() -> None:
    with pytest.raises(ForwardedIdentityError):
        decide_identity(PLAIN, headers(id="x" * 1000), None)


def test_people_are_named_by_email_then_name_then_id() -> None:
    person = decide_identity(PLAIN, headers(id="u-4", name="Dan"), None).person
    assert person is not None and person.names == (None, "Dan", "u-4")


def test_a_user_field_that_is_not_text_is_refused() -> None:
    with pytest.raises(ForwardedIdentityError, match="not valid text"):
        decide_identity(PLAIN, {}, "bad\ud800")
