"""Acceptance 1: a user over their thread cap (max_context_tokens, max_turns) gets exactly the
documented behaviour for on_limit = reject / notify / truncate, and the thread's length and
turns show in /admin/threads and /admin/stats."""

from __future__ import annotations

import openai
import pytest

from officellm.app.policy import drop_turns
from tests.policy.helpers import Office, chat, count_tokens, metric

MODEL = "SmolLM2-135M-Instruct.Q4_1"
TRUNCATED = "x-officellm-truncated"


def context_sentence(tokens: int, cap: int) -> str:
    return (f"This chat has reached {tokens:,} tokens, over your limit of {cap:,}. "
            "Please start a new chat.")


def turns_sentence(turns: int, cap: int) -> str:
    return f"This chat has reached {turns} turns, over your limit of {cap}. Please start a new chat."


def ask(client: openai.OpenAI, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3,
                                          temperature=0, **kw)


def find_thread(office: Office, user: str, turns: int) -> dict:
    threads = office.admin.get(f"/threads?user={user}")
    assert threads == sorted(threads, key=lambda t: -t["length"])  # longest first
    mine = [t for t in threads if t["turns"] == turns]
    assert len(mine) == 1, threads
    return mine[0]


def assert_in_stats(office: Office, user: str, thread: dict) -> None:
    stats = office.admin.get("/stats")
    active = [t for t in stats["active_threads"] if t["thread_key"] == thread["thread_key"]]
    assert len(active) == 1, stats["active_threads"]
    assert active[0]["user"] == user
    for field in ("length", "turns", "cap"):
        assert active[0][field] == thread[field], field


@pytest.fixture
def sizes(tokenizer, uniq):
    """A short chat under the cap and a long one of the same thread (same opening) over it."""
    short, long = chat(1, tag=uniq), chat(6, words=12, tag=uniq)
    n_short, n_long = count_tokens(tokenizer, short), count_tokens(tokenizer, long)
    cap = n_short + 40
    assert n_long > cap + 40
    return short, long, n_short, n_long, cap


def test_reject_over_the_context_cap(office: Office, sizes, uniq) -> None:
    short, long, n_short, n_long, cap = sizes
    user = f"rej-{uniq}"
    key = office.admin.user_with_key(user, max_context_tokens=cap, on_limit="reject")
    client = office.client(key)
    r = ask(client, short)
    assert r.usage.prompt_tokens == n_short
    with pytest.raises(openai.BadRequestError) as exc:
        ask(client, long)
    assert exc.value.status_code == 400
    assert exc.value.body["message"] == context_sentence(n_long, cap)
    assert exc.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):  # streaming: the same 400, before any chunk
        ask(client, long, stream=True)

    thread = find_thread(office, user, turns=1)  # the refused requests changed nothing
    assert thread["length"] == r.usage.prompt_tokens + r.usage.completion_tokens
    assert thread["last_prompt_tokens"] == n_short and thread["cap"] == cap
    assert_in_stats(office, user, thread)
    m = office.metrics(key)
    assert metric(m, "officellm:policy_refusals_total", user=user, reason="max_context_tokens",
                  action="reject") == 2
    events = office.admin.get("/events?kind=policy_refusal&limit=50")
    mine = [e for e in events if e["user"] == user]
    assert len(mine) == 2 and mine[0]["detail"]["tokens"] == n_long
    assert mine[0]["detail"]["limit"] == cap


def test_notify_over_the_context_cap(office: Office, sizes, uniq) -> None:
    short, long, n_short, n_long, cap = sizes
    user = f"ntf-{uniq}"
    key = office.admin.user_with_key(user, max_context_tokens=cap, on_limit="notify")
    client = office.client(key)
    ask(client, short)
    r = ask(client, long)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == context_sentence(n_long, cap)
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.total_tokens == 0  # the engine never ran
    chunks = list(ask(client, long, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == context_sentence(n_long, cap)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and
            c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 0
    thread = find_thread(office, user, turns=1)
    assert thread["last_prompt_tokens"] == n_short
    m = office.metrics(key)
    assert metric(m, "officellm:policy_refusals_total", user=user, action="notify") == 2


def test_truncate_over_the_context_cap(office: Office, tokenizer, sizes, uniq) -> None:
    short, long, n_short, n_long, cap = sizes
    user = f"trn-{uniq}"
    key = office.admin.user_with_key(user, max_context_tokens=cap, on_limit="truncate")
    client = office.client(key)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=long, max_tokens=3, temperature=0)
    dropped = int(raw.headers[TRUNCATED])
    r = raw.parse()
    # The fewest oldest turns were dropped: one fewer would not fit.
    kept = count_tokens(tokenizer, drop_turns(long, dropped))
    assert r.usage.prompt_tokens == kept <= cap
    assert count_tokens(tokenizer, drop_turns(long, dropped - 1)) > cap
    assert r.choices[0].message.content

    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=long, max_tokens=3, temperature=0, stream=True)
    assert int(raw.headers[TRUNCATED]) == dropped
    assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=short, max_tokens=3, temperature=0)
    assert TRUNCATED not in raw.headers  # under the cap: no header

    # The short request came last, so the thread now reads 1 turn; its 6-turn state was the
    # truncated prompt plus the reply (checked through usage above).
    thread = find_thread(office, user, turns=1)
    assert thread["cap"] == cap
    m = office.metrics(key)
    assert metric(m, "officellm:policy_refusals_total", user=user, action="truncate") == 2
    events = office.admin.get("/events?kind=truncation")
    assert [e["detail"]["turns_dropped"] for e in events if e["user"] == user] == [dropped] * 2


@pytest.mark.parametrize("on_limit", ["reject", "notify", "truncate"])
def test_max_turns(office: Office, tokenizer, uniq, on_limit: str) -> None:
    user = f"turns-{on_limit}-{uniq}"
    key = office.admin.user_with_key(user, max_turns=2, on_limit=on_limit)
    client = office.client(key)
    two, three = chat(2, tag=uniq), chat(3, tag=uniq)
    r = ask(client, two)
    thread = find_thread(office, user, turns=2)
    assert thread["length"] == r.usage.prompt_tokens + r.usage.completion_tokens
    assert thread["last_completion_tokens"] == r.usage.completion_tokens
    # No token cap in the policy: the lower of the profile's server cap and the model's length.
    max_model_len = office.admin.get("/stats")["engine"]["max_model_len"]
    assert thread["cap"] == min(16384, max_model_len)
    assert_in_stats(office, user, thread)

    if on_limit == "reject":
        with pytest.raises(openai.BadRequestError) as exc:
            ask(client, three)
        assert exc.value.body["message"] == turns_sentence(3, 2)
        assert exc.value.body["code"] == "turn_limit_exceeded"
    elif on_limit == "notify":
        r = ask(client, three)
        assert r.choices[0].message.content == turns_sentence(3, 2)
        assert r.choices[0].finish_reason == "stop"
    else:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=three, max_tokens=3, temperature=0)
        assert raw.headers[TRUNCATED] == "1"
        r = raw.parse()
        assert r.usage.prompt_tokens == count_tokens(tokenizer, drop_turns(three, 1))
        thread = find_thread(office, user, turns=3)  # the client's turns; the kept length
        assert thread["length"] == r.usage.prompt_tokens + r.usage.completion_tokens
        assert_in_stats(office, user, thread)
    m = office.metrics(key)
    assert metric(m, "officellm:policy_refusals_total", user=user, reason="max_turns",
                  action=on_limit) == 1


# -- the Responses API: the same thread rules, answered in its shapes ----------------------

def test_notify_on_the_responses_api_answers_the_sentence(office: Office, sizes,
                                                          uniq) -> None:
    short, long, n_short, n_long, cap = sizes
    user = f"ntf-resp-{uniq}"
    key = office.admin.user_with_key(user, max_context_tokens=cap, on_limit="notify")
    client = office.client(key)
    r = client.responses.create(model=MODEL, input=long, max_output_tokens=3, temperature=0)
    assert r.status == "completed" and r.output_text == context_sentence(n_long, cap)
    assert r.usage.total_tokens == 0  # the engine never ran
    events = list(client.responses.create(model=MODEL, input=long, max_output_tokens=3,
                                          temperature=0, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == \
        context_sentence(n_long, cap)
    assert events[-1].type == "response.completed"
    assert events[-1].response.usage.total_tokens == 0


def test_truncate_on_the_responses_api_says_how_many_turns_it_dropped(
        office: Office, tokenizer, sizes, uniq) -> None:
    short, long, n_short, n_long, cap = sizes
    user = f"trn-resp-{uniq}"
    key = office.admin.user_with_key(user, max_context_tokens=cap, on_limit="truncate")
    raw = office.client(key).responses.with_raw_response.create(
        model=MODEL, input=long, max_output_tokens=3, temperature=0)
    dropped = int(raw.headers[TRUNCATED])
    assert raw.parse().usage.input_tokens == count_tokens(tokenizer, drop_turns(long, dropped))


def _anthropic(office: Office, key: str):
    import anthropic

    return anthropic.Anthropic(base_url=office.base_url, api_key=key, max_retries=0)


def _as_anthropic(messages: list[dict]) -> dict:
    """A chat in the Messages API's shape: the system message as `system`."""
    system = [m["content"] for m in messages if m["role"] == "system"]
    rest = [m for m in messages if m["role"] != "system"]
    return {"system": system[0] if system else None, "messages": rest}


def test_reject_on_the_messages_api_is_anthropics_400_with_the_sentence(office: Office, sizes,
                                                                        uniq) -> None:
    import anthropic

    short, long, n_short, n_long, cap = sizes
    user = f"rej-msg-{uniq}"
    key = office.admin.user_with_key(user, max_context_tokens=cap, on_limit="reject")
    claude = _anthropic(office, key)
    r = claude.messages.create(model=MODEL, max_tokens=3, **_as_anthropic(short))
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == n_short
    with pytest.raises(anthropic.BadRequestError) as exc:
        claude.messages.create(model=MODEL, max_tokens=3, **_as_anthropic(long))
    assert exc.value.body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": context_sentence(n_long, cap)}}
    m = office.metrics(key)
    assert metric(m, "officellm:policy_refusals_total", user=user, reason="max_context_tokens",
                  action="reject") == 1


def test_notify_on_the_messages_api_answers_the_sentence(office: Office, sizes, uniq) -> None:
    short, long, n_short, n_long, cap = sizes
    user = f"ntf-msg-{uniq}"
    key = office.admin.user_with_key(user, max_context_tokens=cap, on_limit="notify")
    r = _anthropic(office, key).messages.create(model=MODEL, max_tokens=3,
                                                **_as_anthropic(long))
    assert [b.text for b in r.content] == [context_sentence(n_long, cap)]
    assert r.stop_reason == "end_turn" and r.usage.output_tokens == 0
