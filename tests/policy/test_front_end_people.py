"""Open WebUI in front (issue 19): one front-end key, each person a user, each chat a thread.

The real server, the real `openai` client sending what Open WebUI 0.12.4 sends
(open_webui/utils/headers.py: the X-OpenWebUI-User-* headers, or one HS256 JWT minted with
PyJWT as its `_mint_forward_user_jwt` mints it; X-OpenWebUI-Chat-Id), and the admin API to see
what the console would show.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import httpx
import jwt
import openai
import pytest

from officellm.app.policy.messages import turn_limit_message
from tests.policy.helpers import Office, chat, metric

MODEL = "SmolLM2-135M-Instruct.Q4_1"
SECRET = "office-webui-forwarding-secret-0123456789abcdef"


def person_headers(uid: str, email: str, name: str, role: str = "user") -> dict[str, str]:
    """What Open WebUI sends with ENABLE_FORWARD_USER_INFO_HEADERS=True and no JWT secret."""
    return {"X-OpenWebUI-User-Name": quote(name.strip(), safe=" "),
            "X-OpenWebUI-User-Id": uid, "X-OpenWebUI-User-Email": email,
            "X-OpenWebUI-User-Role": role}


def mint(uid: str, email: str, name: str, secret: str = SECRET, expires_s: int = 300,
         role: str = "user", **override: Any) -> str:
    """A forwarded-user JWT exactly as Open WebUI 0.12.4 mints it."""
    now = int(time.time())
    payload = {"sub": str(uid), "email": str(email), "name": str(name), "role": str(role),
               "iss": "open-webui", "iat": now, "exp": now + expires_s, **override}
    return jwt.encode(payload, secret, algorithm="HS256")


class FrontEnd:
    """A front-end key and the `openai` client Open WebUI would be, one person at a time."""

    def __init__(self, office: Office, name: str, jwt_secret: str | None = None) -> None:
        self.office = office
        self.name = name
        office.admin.request("POST", "/users", json={"name": name}, expect=201)
        body: dict[str, Any] = {"user": name, "forwarded_users": True}
        if jwt_secret is not None:
            body["jwt_secret"] = jwt_secret
        issued = office.admin.request("POST", "/keys", json=body, expect=201)
        assert issued["forwarded_users"] is True and issued["jwt_secret"] is (jwt_secret
                                                                                 is not None)
        self.key = issued["key"]

    def client(self, headers: dict[str, str] | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.office.base_url}/v1", api_key=self.key,
                             default_headers=headers or {}, timeout=120, max_retries=0)

    def chat(self, headers: dict[str, str], messages: list[dict[str, str]],
             chat_id: str | None = None, **kw: Any) -> Any:
        extra = {"X-OpenWebUI-Chat-Id": chat_id} if chat_id else {}
        return self.client(headers).chat.completions.create(
            model=MODEL, messages=messages, max_tokens=kw.pop("max_tokens", 1), temperature=0,
            extra_headers=extra, **kw)


def users(office: Office) -> dict[str, dict[str, Any]]:
    return {u["name"]: u for u in office.admin.get("/users")}


def threads(office: Office, user: str) -> list[dict[str, Any]]:
    return office.admin.get("/threads", params={"user": user})


def title_prompt(history: str) -> str:
    """The shape of Open WebUI's default title prompt: a task, then the chat in tags."""
    return ("### Task:\nGenerate a concise title summarizing the chat history.\n"
            "### Output:\nJSON format: { \"title\": \"your concise title here\" }\n"
            f"### Chat History:\n<chat_history>\n{history}\n</chat_history>")


@pytest.fixture
def webui(office: Office, uniq: str) -> FrontEnd:
    return FrontEnd(office, f"open-webui-{uniq}")


@pytest.fixture
def signed(office: Office, uniq: str) -> FrontEnd:
    return FrontEnd(office, f"signed-webui-{uniq}", jwt_secret=SECRET)


def test_two_people_through_one_key_are_two_users(office: Office, webui: FrontEnd,
                                                  uniq: str) -> None:
    alice = person_headers(f"a-{uniq}", f"alice-{uniq}@example.com", "Alice Example")
    bob = person_headers(f"b-{uniq}", f"bob-{uniq}@example.com", "Bob Example")
    webui.chat(alice, chat(1))
    webui.chat(alice, chat(1))
    webui.chat(bob, chat(1))
    seen = users(office)
    a, b = seen[f"alice-{uniq}@example.com"], seen[f"bob-{uniq}@example.com"]
    assert (a["via"], b["via"]) == (webui.name, webui.name)
    assert (a["usage_today"]["requests"], b["usage_today"]["requests"]) == (2, 1)
    assert seen[webui.name]["usage_today"]["requests"] == 0  # the front end itself used nothing
    assert seen[webui.name]["via"] is None


def test_a_renamed_person_stays_the_same_user(office: Office, webui: FrontEnd, uniq: str) -> None:
    webui.chat(person_headers(f"r-{uniq}", f"rita-{uniq}@example.com", "Rita"), chat(1))
    webui.chat(person_headers(f"r-{uniq}", f"rita.new-{uniq}@example.com", "Rita"), chat(1))
    seen = users(office)
    assert seen[f"rita-{uniq}@example.com"]["usage_today"]["requests"] == 2
    assert f"rita.new-{uniq}@example.com" not in seen


def test_each_person_has_their_own_cap(office: Office, webui: FrontEnd, uniq: str) -> None:
    carol = person_headers(f"c-{uniq}", f"carol-{uniq}@example.com", "Carol")
    dave = person_headers(f"d-{uniq}", f"dave-{uniq}@example.com", "Dave")
    webui.chat(carol, chat(1))  # first sight: the user exists, with the default policy
    office.admin.request("PUT", f"/policies/users/carol-{uniq}@example.com",
                         json={"max_turns": 2, "on_limit": "reject"})
    with pytest.raises(openai.BadRequestError) as refused:
        webui.chat(carol, chat(3))
    # What Open WebUI shows: the error object's `detail` (and OpenAI's `message`, for others).
    error = refused.value.body
    assert error["message"] == error["detail"] == turn_limit_message(3, 2)
    webui.chat(dave, chat(3))  # the same chat is fine for someone else


def test_notify_is_the_assistant_message(office: Office, webui: FrontEnd, uniq: str) -> None:
    erin = person_headers(f"e-{uniq}", f"erin-{uniq}@example.com", "Erin")
    webui.chat(erin, chat(1))
    office.admin.request("PUT", f"/policies/users/erin-{uniq}@example.com",
                         json={"max_turns": 1, "on_limit": "notify"})
    answer = webui.chat(erin, chat(2))
    assert answer.choices[0].message.content == turn_limit_message(2, 1)
    stream = webui.chat(erin, chat(2), stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == \
        turn_limit_message(2, 1)


def test_each_person_has_their_own_quota(office: Office, webui: FrontEnd, uniq: str) -> None:
    fay = person_headers(f"f-{uniq}", f"fay-{uniq}@example.com", "Fay")
    gus = person_headers(f"g-{uniq}", f"gus-{uniq}@example.com", "Gus")
    webui.chat(fay, chat(1))
    office.admin.request("PUT", f"/policies/users/fay-{uniq}@example.com",
                         json={"max_tokens_per_day": 1})
    with pytest.raises(openai.RateLimitError) as refused:
        webui.chat(fay, chat(1))
    assert refused.value.body["detail"].startswith("You have used")
    webui.chat(gus, chat(1))


def test_each_person_has_their_own_prefix_cache_salt(office: Office, webui: FrontEnd,
                                                     uniq: str) -> None:
    system = f"[{uniq}] You are the office assistant. " + "Answer politely and briefly. " * 40
    prompt = [{"role": "system", "content": system}, {"role": "user", "content": "Hello!"}]
    hank = person_headers(f"h-{uniq}", f"hank-{uniq}@example.com", "Hank")
    iris = person_headers(f"i-{uniq}", f"iris-{uniq}@example.com", "Iris")

    def hits(headers: dict[str, str]) -> float:
        before = metric(office.metrics(webui.key), "vllm:prefix_cache_hits_total")
        webui.chat(headers, prompt)
        return metric(office.metrics(webui.key), "vllm:prefix_cache_hits_total") - before

    assert hits(hank) == 0
    assert hits(iris) == 0  # the same prompt, another person: nothing shared
    assert hits(hank) >= 160  # the same person hits their own cached blocks


def test_the_chat_id_decides_the_thread(office: Office, webui: FrontEnd, uniq: str) -> None:
    jane = person_headers(f"j-{uniq}", f"jane-{uniq}@example.com", "Jane")
    webui.chat(jane, chat(1, tag="first"), chat_id=f"chat-1-{uniq}")
    # The same Open WebUI chat, its opening edited: still one thread, now of 2 turns.
    webui.chat(jane, chat(2, tag="edited"), chat_id=f"chat-1-{uniq}")
    # The same messages in a new Open WebUI chat: a new thread.
    webui.chat(jane, chat(2, tag="edited"), chat_id=f"chat-2-{uniq}")
    seen = threads(office, f"jane-{uniq}@example.com")
    assert sorted(t["turns"] for t in seen) == [2, 2]


def test_title_tags_and_follow_ups_add_no_turns(office: Office, webui: FrontEnd,
                                                uniq: str) -> None:
    kim = person_headers(f"k-{uniq}", f"kim-{uniq}@example.com", "Kim")
    chat_id = f"chat-{uniq}"
    webui.chat(kim, chat(3), chat_id=chat_id)
    (before,) = threads(office, f"kim-{uniq}@example.com")
    history = "USER: question 2\nASSISTANT: answer 2"
    webui.chat(kim, [{"role": "user", "content": title_prompt(history)}], chat_id=chat_id)
    # With the connection header {"X-OpenWebUI-Task": "{{TASK}}"} any prompt is recognised.
    webui.chat({**kim, "X-OpenWebUI-Task": "tags_generation"},
               [{"role": "user", "content": "Tag this chat: question 2."}], chat_id=chat_id)
    webui.chat({**kim, "X-OpenWebUI-Task": "follow_up_generation"},
               [{"role": "user", "content": "Suggest follow-ups."}], chat_id=chat_id)
    (after,) = threads(office, f"kim-{uniq}@example.com")
    assert (after["turns"], after["length"]) == (before["turns"], before["length"]) == (
        3, before["length"])
    assert users(office)[f"kim-{uniq}@example.com"]["usage_today"]["requests"] == 4


def test_a_background_task_never_trips_the_chats_turn_cap(office: Office, webui: FrontEnd,
                                                          uniq: str) -> None:
    lea = person_headers(f"l-{uniq}", f"lea-{uniq}@example.com", "Lea")
    webui.chat(lea, chat(1))
    office.admin.request("PUT", f"/policies/users/lea-{uniq}@example.com",
                         json={"max_turns": 1, "on_limit": "notify"})
    # A task sent with the chat's whole history (a custom task prompt, marked by the header):
    # three user messages, over the cap of 1 turn, yet no turn of anyone's chat.
    answer = webui.chat({**lea, "X-OpenWebUI-Task": "tags_generation"}, chat(3),
                        chat_id=f"chat-{uniq}", max_tokens=3)
    assert answer.choices[0].message.content != turn_limit_message(3, 1)
    assert answer.usage.completion_tokens > 0  # the model answered it
    # And it is nobody's thread: only the chat of the first request is there.
    assert [t["turns"] for t in threads(office, f"lea-{uniq}@example.com")] == [1]


def test_the_user_field_names_the_person(office: Office, webui: FrontEnd, uniq: str) -> None:
    webui.chat({}, chat(1), user=f"max-{uniq}@example.com")
    webui.chat({}, chat(1), user=f"max-{uniq}@example.com")
    seen = users(office)[f"max-{uniq}@example.com"]
    assert (seen["via"], seen["usage_today"]["requests"]) == (webui.name, 2)


def test_nobody_forwarded_is_the_front_end_itself(office: Office, webui: FrontEnd) -> None:
    webui.chat({}, chat(1))
    assert users(office)[webui.name]["usage_today"]["requests"] == 1


def test_disabling_one_person_refuses_only_them(office: Office, webui: FrontEnd,
                                                uniq: str) -> None:
    nora = person_headers(f"n-{uniq}", f"nora-{uniq}@example.com", "Nora")
    otto = person_headers(f"o-{uniq}", f"otto-{uniq}@example.com", "Otto")
    webui.chat(nora, chat(1))
    office.admin.request("PATCH", f"/users/nora-{uniq}@example.com", json={"disabled": True})
    with pytest.raises(openai.PermissionDeniedError) as refused:
        webui.chat(nora, chat(1))
    assert "disabled" in refused.value.body["detail"]
    webui.chat(otto, chat(1))


def test_forwarded_identity_on_an_ordinary_key_changes_nothing(office: Office,
                                                               uniq: str) -> None:
    key = office.admin.user_with_key(f"plain-{uniq}")
    client = openai.OpenAI(base_url=f"{office.base_url}/v1", api_key=key, max_retries=0,
                           default_headers={
                               **person_headers(f"p-{uniq}", f"boss-{uniq}@example.com", "Boss"),
                               "X-OpenWebUI-User-Jwt": mint(f"p-{uniq}", "boss@x", "Boss")})
    client.chat.completions.create(model=MODEL, messages=chat(1), max_tokens=1)
    client.chat.completions.create(model=MODEL, messages=chat(1), max_tokens=1)
    seen = users(office)
    assert f"boss-{uniq}@example.com" not in seen
    assert seen[f"plain-{uniq}"]["usage_today"]["requests"] == 2
    log = office.server.output()
    assert log.count(f"plain-{uniq} sent x-openwebui-user-jwt") == 1  # logged once


def test_a_valid_jwt_names_the_person(office: Office, signed: FrontEnd, uniq: str) -> None:
    token = mint(f"q-{uniq}", f"quinn-{uniq}@example.com", "Quinn")
    signed.chat({"X-OpenWebUI-User-Jwt": token}, chat(1))
    seen = users(office)[f"quinn-{uniq}@example.com"]
    assert (seen["via"], seen["usage_today"]["requests"]) == (signed.name, 1)


@pytest.mark.parametrize("token", [
    pytest.param(lambda u: mint(u, f"{u}@x.com", "X", secret="a-forged-secret-" * 3),
                 id="forged"),
    pytest.param(lambda u: mint(u, f"{u}@x.com", "X", expires_s=-600), id="expired"),
    pytest.param(lambda u: jwt.encode({"sub": u, "iss": "open-webui", "iat": int(time.time()),
                                       "exp": int(time.time()) + 300}, None, algorithm="none"),
                 id="unsigned"),
    pytest.param(lambda u: mint(u, f"{u}@x.com", "X", iss="someone-else"), id="foreign-issuer"),
    pytest.param(lambda u: None, id="missing"),
])
def test_a_bad_jwt_is_refused(office: Office, signed: FrontEnd, uniq: str, token) -> None:
    value = token(f"z-{uniq}")
    headers = {"X-OpenWebUI-User-Jwt": value} if value else person_headers(
        f"z-{uniq}", f"z-{uniq}@x.com", "Z")  # the plain headers never replace the JWT
    with pytest.raises(openai.AuthenticationError):
        signed.chat(headers, chat(1))
    assert f"z-{uniq}@x.com" not in users(office)
    assert users(office)[signed.name]["usage_today"]["requests"] == 0  # no silent fall-back


def test_keys_list_tells_front_end_keys(office: Office, signed: FrontEnd) -> None:
    (key,) = office.admin.get("/keys", params={"user": signed.name})
    assert (key["forwarded_users"], key["jwt_secret"]) == (True, True)
    assert SECRET not in httpx.get(f"{office.base_url}/admin/keys", headers=office.admin.headers,
                                   timeout=30).text
