"""Acceptance 2 and 5: concurrency and daily quota -> 429 with Retry-After; a revoked key ->
401; the admin API refuses user keys (403) and missing or wrong tokens (401); the raw key never
reaches the database file."""

from __future__ import annotations

import hashlib
import time

import httpx
import openai
import pytest

from tests.policy.helpers import TIMEOUT, Office, chat, metric

MODEL = "SmolLM2-135M-Instruct.Q4_1"


def ask(client: openai.OpenAI, **kw):
    return client.chat.completions.create(model=MODEL, messages=chat(1), max_tokens=3,
                                          temperature=0, **kw)


def test_concurrency_limit_429_with_retry_after(office: Office, uniq) -> None:
    user = f"conc-{uniq}"
    client = office.client(office.admin.user_with_key(user, max_concurrent_requests=1))
    stream = client.chat.completions.create(
        model=MODEL, messages=chat(1), max_tokens=400, temperature=0, stream=True,
        extra_body={"ignore_eos": True})
    try:
        next(iter(stream))  # the first request is running and holds the only slot
        with pytest.raises(openai.RateLimitError) as exc:
            ask(client)
        assert exc.value.status_code == 429
        assert int(exc.value.response.headers["retry-after"]) >= 1
        assert exc.value.body["type"] == "rate_limit_error"
        assert "1 request running" in exc.value.body["message"]
    finally:
        stream.close()  # the client leaves: the server aborts it and frees the slot
    for _ in range(50):  # the abort lands within a moment
        try:
            ask(client)
            break
        except openai.RateLimitError:
            time.sleep(0.1)
    else:
        pytest.fail("the slot was never released")
    events = office.admin.get("/events?kind=concurrency")
    assert any(e["user"] == user for e in events)


def test_daily_quota_429_until_midnight(office: Office, uniq) -> None:
    user = f"quota-{uniq}"
    key = office.admin.user_with_key(user, max_tokens_per_day=20)
    client = office.client(key)
    r = ask(client)  # starts under the quota, so it runs to the end
    assert r.usage.total_tokens > 20
    for call in (lambda: ask(client), lambda: client.completions.create(
            model=MODEL, prompt="Hello", max_tokens=2)):
        with pytest.raises(openai.RateLimitError) as exc:
            call()
        retry = int(exc.value.response.headers["retry-after"])
        assert 1 <= retry <= 86400
        assert exc.value.body["code"] == "insufficient_quota"
        assert "daily limit is 20" in exc.value.body["message"]
    users = {u["name"]: u for u in office.admin.get("/users")}
    assert users[user]["usage_today"] == {"requests": 1, "prompt_tokens": r.usage.prompt_tokens,
                                          "completion_tokens": r.usage.completion_tokens}
    usage = [u for u in office.admin.get("/usage?days=1")["rows"] if u["user"] == user]
    assert len(usage) == 1 and usage[0]["requests"] == 1
    m = office.metrics(key)
    assert metric(m, "officellm:policy_refusals_total", user=user,
                  reason="max_tokens_per_day") == 2
    assert len([e for e in office.admin.get("/events?kind=quota") if e["user"] == user]) == 2


def test_revoked_key_and_disabled_user_get_401(office: Office, uniq) -> None:
    admin = office.admin
    user = f"rev-{uniq}"
    key = admin.user_with_key(user)
    client = office.client(key)
    ask(client)
    keys = admin.get(f"/keys?user={user}")
    assert len(keys) == 1 and key.startswith(keys[0]["prefix"]) and keys[0]["last_used"]
    revoked = admin.request("DELETE", f"/keys/{keys[0]['id']}")
    assert revoked["revoked"] is True and revoked["user"] == user
    with pytest.raises(openai.AuthenticationError) as exc:
        ask(client)  # the very next request
    assert exc.value.body["code"] == "invalid_api_key"

    key2 = admin.request("POST", "/keys", json={"user": user}, expect=201)["key"]
    ask(office.client(key2))
    assert admin.request("PATCH", f"/users/{user}", json={"disabled": True})["disabled"] is True
    with pytest.raises(openai.AuthenticationError):
        ask(office.client(key2))
    admin.request("PATCH", f"/users/{user}", json={"disabled": False})
    ask(office.client(key2))
    with pytest.raises(openai.AuthenticationError):
        ask(office.client("ocl-" + "x" * 43))


def test_admin_needs_the_admin_token(office: Office, uniq) -> None:
    url = f"{office.base_url}/admin/users"
    key = office.admin.user_with_key(f"nosy-{uniq}")
    r = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=TIMEOUT)
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    r = httpx.post(f"{office.base_url}/admin/keys", json={"user": f"nosy-{uniq}"},
                   headers={"Authorization": f"Bearer {key}"}, timeout=TIMEOUT)
    assert r.status_code == 403
    r = httpx.get(url, timeout=TIMEOUT)
    assert r.status_code == 401 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.get(url, headers={"Authorization": "Bearer ocl-admin-wrong"}, timeout=TIMEOUT)
    assert r.status_code == 401
    assert office.admin.token_file.stat().st_mode & 0o777 == 0o600
    log = office.server.output()  # the start-up log names the file, never the token
    assert f"Admin token created and written to {office.admin.token_file}" in log
    assert office.admin.token not in log
    # The admin token is no user key either.
    with pytest.raises(openai.AuthenticationError):
        ask(office.client(office.admin.token))


def test_admin_validation_errors(office: Office, uniq) -> None:
    admin = office.admin
    err = admin.request("PUT", "/policies/default", json={"max_turns": 0}, expect=400)["error"]
    assert err["param"] == "max_turns" and "max_turns" in err["message"]
    err = admin.request("PUT", "/policies/default", json={"on_limit": "shout"}, expect=400)
    assert err["error"]["param"] == "on_limit"
    err = admin.request("PUT", "/policies/default", json={"colour": 1}, expect=400)
    assert err["error"]["param"] == "colour"
    admin.request("PUT", "/policies/users/nobody-at-all", json={"max_turns": 3}, expect=404)
    admin.request("POST", "/users", json={"name": f"dup-{uniq}"}, expect=201)
    admin.request("POST", "/users", json={"name": f"dup-{uniq}"}, expect=409)
    admin.request("POST", "/users", json={"name": "no spaces"}, expect=400)
    admin.request("DELETE", "/keys/999999", expect=404)
    assert admin.get("/policies")["default"]["on_limit"] == "reject"  # nothing changed


def test_raw_key_never_in_the_database_file(office: Office, uniq) -> None:
    admin = office.admin
    key = admin.user_with_key(f"bytes-{uniq}")
    ask(office.client(key))
    admin.get("/keys")  # flushes the writer: last_used is on disk now
    files = [p for p in admin.db_path.parent.iterdir() if p.name.startswith(admin.db_path.name)]
    data = b"".join(p.read_bytes() for p in files)
    assert key.encode() not in data
    assert key[:20].encode() not in data  # not even beyond the shown prefix
    # The test can see what is there: the key's hash is.
    assert hashlib.sha256(key.encode()).hexdigest().encode() in data
