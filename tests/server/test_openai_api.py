"""Acceptance 1, 4, 5, 7: the real `openai` client against a real server (bundled SmolLM2)."""

from __future__ import annotations

import httpx
import openai
import pytest

from officellm.engine import SamplingParams
from tests.server.conftest import DEFAULT_MAX_TOKENS
from tests.support.openai_errors import openai_error as _error
from tests.support.server_api import CHAT, TIMEOUT, sample, scrape
from tests.support.server_process import ServerProcess

# -- 1. chat, stream, completions, models; parity with engine.LLM --------------------------

def test_models_list(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert len(models) == 1 and models[0].id == "SmolLM2-135M-Instruct.Q4_1"
    assert models[0].object == "model"


def test_chat_greedy_matches_engine(client, model, reference_llm) -> None:
    ref = reference_llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=24))[0]
    r = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=24)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == ref.outputs[0].text
    assert choice.finish_reason == ref.outputs[0].finish_reason
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert r.usage.completion_tokens == len(ref.outputs[0].token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_matches_non_stream(client, model, reference_llm) -> None:
    ref = reference_llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=24))[0]
    chunks = list(client.chat.completions.create(
        model=model, messages=CHAT, temperature=0, max_completion_tokens=24, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:] if c.choices)
    assert len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.outputs[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [ref.outputs[0].finish_reason]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    assert usage_chunk.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert usage_chunk.usage.completion_tokens == len(ref.outputs[0].token_ids)


def test_stream_ends_with_done(server: ServerProcess, model: str) -> None:
    body = {"model": model, "messages": CHAT, "max_tokens": 3, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body,
                      headers=server.headers, timeout=TIMEOUT) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert '"usage"' not in "".join(events)  # no include_usage: no usage in the stream


def test_completions_greedy_matches_engine(client, model, reference_llm) -> None:
    prompt = "The three primary colors are"
    ref = reference_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12))[0]
    r = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=12)
    assert r.object == "text_completion"
    assert r.choices[0].text == ref.outputs[0].text
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert r.usage.completion_tokens == len(ref.outputs[0].token_ids)
    stream = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=12,
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream) == ref.outputs[0].text


def test_a_request_without_max_tokens_gets_the_servers_default(client, model) -> None:
    """Front ends such as Open WebUI send no max_tokens: the server's --default-max-tokens
    (DEFAULT_MAX_TOKENS on the shared server) bounds the answer."""
    chat = client.chat.completions.create(model=model, messages=CHAT, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert (chat.usage.completion_tokens, chat.choices[0].finish_reason) == (
        DEFAULT_MAX_TOKENS, "length")


def test_n_seed_logprobs_and_stop(client, model) -> None:
    kw = dict(model=model, messages=CHAT, temperature=1.0, seed=7, max_tokens=5, n=2,
              logprobs=True, top_logprobs=3)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert [c.index for c in a.choices] == [0, 1]
    total = 0
    for c in a.choices:
        assert c.logprobs is not None and len(c.logprobs.content) >= 1
        for item in c.logprobs.content:
            assert item.logprob <= 0 and len(item.top_logprobs) == 3
            ranked = [t.logprob for t in item.top_logprobs]
            assert ranked == sorted(ranked, reverse=True)
        total += len(c.logprobs.content)
    assert a.usage.completion_tokens == total
    # Completions: logprobs as an int, a batch of two prompts, and a stop string.
    r = client.completions.create(model=model, prompt=["One, two,", "Red, green,"], max_tokens=6,
                                  temperature=0, logprobs=2, stop=[","])
    assert len(r.choices) == 2
    for c in r.choices:
        assert "," not in c.text
        assert c.finish_reason in ("stop", "length")
        assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) >= 1


# -- 4. errors in OpenAI's shape, and the server keeps serving -----------------------------

def _chat_url(server: ServerProcess) -> str:
    return f"{server.base_url}/v1/chat/completions"


def _chat_prompt_over_the_context(server, client, model) -> None:
    too_long = {"model": model, "messages": [{"role": "user", "content": "hello " * 7000}]}
    err = _error(httpx.post(_chat_url(server), json=too_long, headers=server.headers,
                            timeout=TIMEOUT), 400)
    assert err["message"].startswith("This model's maximum context length is 5824 tokens. "
                                     "However, your request has ")
    assert err["message"].endswith("input tokens. Please reduce the length of the input messages.")


def _completions_prompt_over_the_context(server, client, model) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=model, prompt="hello " * 7000, max_tokens=4)
    assert "maximum context length is 5824 tokens" in exc.value.message


def _malformed_json(server, client, model) -> None:
    _error(httpx.post(_chat_url(server), content=b'{"model": "x", "messages": [',
                      headers=server.headers | {"content-type": "application/json"},
                      timeout=TIMEOUT), 400)


def _temperature_not_a_number(server, client, model) -> None:
    err = _error(httpx.post(_chat_url(server), json={"model": model, "messages": CHAT,
                                                     "temperature": "hot"},
                            headers=server.headers, timeout=TIMEOUT), 400)
    assert err["param"] == "temperature"


def _messages_not_a_list(server, client, model) -> None:
    _error(httpx.post(_chat_url(server), json={"model": model, "messages": "hi"},
                      headers=server.headers, timeout=TIMEOUT), 400)


def _negative_max_tokens(server, client, model) -> None:
    err = _error(httpx.post(_chat_url(server), json={"model": model, "messages": CHAT,
                                                     "max_tokens": -5},
                            headers=server.headers, timeout=TIMEOUT), 400)
    assert err["param"] == "max_tokens"


def _negative_temperature(server, client, model) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=CHAT, temperature=-0.5)


def _unknown_model(server, client, model) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-4o", messages=CHAT)
    assert exc.value.body["code"] == "model_not_found"


def _unknown_route(server, client, model) -> None:
    _error(httpx.get(f"{server.base_url}/v1/nothing-here", headers=server.headers, timeout=10),
           404)


def _no_api_key(server, client, model) -> None:
    err = _error(httpx.post(_chat_url(server), json={"model": model, "messages": CHAT},
                            timeout=10), 401)
    assert err["code"] == "invalid_api_key"


def _wrong_api_key(server, client, model) -> None:
    _error(httpx.get(f"{server.base_url}/v1/models", headers={"Authorization": "Bearer wrong"},
                     timeout=10), 401)


BAD_REQUESTS = {
    "chat-prompt-over-the-context": _chat_prompt_over_the_context,
    "completions-prompt-over-the-context": _completions_prompt_over_the_context,
    "malformed-json": _malformed_json,
    "temperature-not-a-number": _temperature_not_a_number,
    "messages-not-a-list": _messages_not_a_list,
    "negative-max-tokens": _negative_max_tokens,
    "negative-temperature": _negative_temperature,
    "unknown-model": _unknown_model,
    "unknown-route": _unknown_route,
    "no-api-key": _no_api_key,
    "wrong-api-key": _wrong_api_key,
}
STREAMED = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def undisturbed_reply(reference_llm) -> str:
    """What the stream that runs beside each bad request must say: the engine's greedy reply."""
    return reference_llm.chat(CHAT, STREAMED)[0].outputs[0].text


@pytest.mark.parametrize("bad_request", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_errors_are_openai_shaped_and_harmless(server: ServerProcess, client, model,
                                               undisturbed_reply, bad_request) -> None:
    # A request streaming meanwhile must not be disturbed by the bad one: it is under way
    # (its first token arrived) when the bad request is sent, and says what it says alone.
    stream = iter(client.chat.completions.create(
        model=model, messages=CHAT, temperature=0, max_tokens=STREAMED.max_tokens, stream=True,
        extra_body={"ignore_eos": True}))
    streamed = ""
    for c in stream:
        streamed += (c.choices[0].delta.content or "") if c.choices else ""
        if streamed:
            break
    bad_request(server, client, model)  # refused in OpenAI's shape (its own assertions)
    streamed += "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == undisturbed_reply
    # And the server still serves afterwards.
    r = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=4)
    assert r.choices[0].message.content and r.usage.completion_tokens == 4


def test_health_needs_no_api_key(server: ServerProcess) -> None:
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200  # no auth


# -- 5. /metrics parses, and the counters move by the right amounts ------------------------

def test_metrics_move_by_one_request(server: ServerProcess, client, model) -> None:
    before = scrape(server)
    name = {"model_name": model}
    for metric in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                   "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
                   "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                   "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        assert (metric, tuple(sorted(name.items()))) in before, metric
    r = client.chat.completions.create(
        model=model, temperature=0, max_tokens=10,
        messages=[{"role": "user", "content": "Name a metric that moves."}],
        extra_body={"ignore_eos": True})
    after = scrape(server)
    assert r.usage.completion_tokens == 10

    def delta(metric: str, **labels: str) -> float:
        return sample(after, metric, **labels) - sample(before, metric, **labels)

    assert delta("vllm:prompt_tokens_total", **name) == r.usage.prompt_tokens
    assert delta("vllm:generation_tokens_total", **name) == r.usage.completion_tokens
    assert delta("vllm:prefix_cache_queries_total", **name) == r.usage.prompt_tokens
    assert delta("vllm:time_to_first_token_seconds_count", **name) == 1
    assert delta("vllm:e2e_request_latency_seconds_count", **name) == 1
    assert delta("vllm:inter_token_latency_seconds_count", **name) == 9
    user = dict(name, user="key1")
    assert delta("officellm:requests_total", **user) == 1
    assert delta("officellm:prompt_tokens_total", **user) == r.usage.prompt_tokens
    assert delta("officellm:generation_tokens_total", **user) == r.usage.completion_tokens
    assert sample(after, "vllm:num_requests_running", **name) == 0
    assert sample(after, "vllm:kv_cache_usage_perc", **name) == 0


# -- 7. multi-byte UTF-8 streams without replacement characters ----------------------------

@pytest.mark.parametrize("kind", ["chat-greedy", "completions-seeded"])
def test_multibyte_utf8_stream(client, model, kind: str) -> None:
    if kind == "chat-greedy":
        kw = dict(model=model, messages=[{"role": "user", "content": "Say hello in Japanese."}],
                  temperature=0, max_tokens=12)
        full = client.chat.completions.create(**kw).choices[0].message.content
        pieces = [c.choices[0].delta.content or "" for c in
                  client.chat.completions.create(**kw, stream=True) if c.choices]
    else:
        kw = dict(model=model, prompt="日本語の挨拶: こんにちは、おはよう、", temperature=1.0, seed=3,
                  max_tokens=12)
        full = client.completions.create(**kw).choices[0].text
        pieces = [c.choices[0].text for c in client.completions.create(**kw, stream=True)]
    assert any(len(ch.encode()) > 1 for ch in full), full  # the reply really is multi-byte
    assert "\ufffd" not in full
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == full
