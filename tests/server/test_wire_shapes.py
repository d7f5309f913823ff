"""The exact JSON keys (in order) and nulls of every answer shape, streamed or not: what
OpenAI's clients parse, kept as it was when the answers became pydantic models
(app/openai/answers.py). A key that appears, disappears or moves fails here."""

from __future__ import annotations

import json

import httpx

from tests.support.server_process import ServerProcess

TIMEOUT = 120.0
CHAT = [{"role": "user", "content": "Say hello."}]
TOP = ["id", "object", "created", "model", "choices"]
CHOICE_CHAT = ["index", "message", "logprobs", "finish_reason", "stop_reason"]
CHOICE_TEXT = ["index", "text", "logprobs", "finish_reason", "stop_reason"]


def post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    r = httpx.post(f"{server.base_url}{path}", json=body, headers=server.headers, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r


def events(r: httpx.Response) -> list[dict]:
    lines = [line for line in r.text.split("\n\n") if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def test_chat_answer(server: ServerProcess) -> None:
    body = post(server, "/v1/chat/completions",
                {"messages": CHAT, "max_tokens": 3, "temperature": 0}).json()
    assert list(body) == [*TOP, "usage"] and body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert list(choice) == CHOICE_CHAT and choice["logprobs"] is None
    assert choice["stop_reason"] is None and choice["finish_reason"] == "length"
    assert choice["message"]["role"] == "assistant" and list(choice["message"]) == ["role", "content"]
    assert list(body["usage"]) == ["prompt_tokens", "completion_tokens", "total_tokens"]
    lp = post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "logprobs": True,
                                               "top_logprobs": 1}).json()["choices"][0]["logprobs"]
    assert list(lp) == ["content"]
    assert list(lp["content"][0]) == ["token", "logprob", "bytes", "top_logprobs"]
    assert list(lp["content"][0]["top_logprobs"][0]) == ["token", "logprob", "bytes"]


def test_chat_stream(server: ServerProcess) -> None:
    for include_usage in (False, True):
        body = {"messages": CHAT, "max_tokens": 3, "temperature": 0, "stream": True}
        if include_usage:
            body["stream_options"] = {"include_usage": True}
        chunks = events(post(server, "/v1/chat/completions", body))
        tail = ["usage"] if include_usage else []
        if include_usage:  # the totals, last, without choices; usage null on the others
            usage = chunks.pop()
            assert list(usage) == [*TOP, "usage"] and usage["choices"] == []
            assert list(usage["usage"]) == ["prompt_tokens", "completion_tokens", "total_tokens"]
            assert all(c["usage"] is None for c in chunks)
        assert all(list(c) == [*TOP, *tail] for c in chunks)
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        role, *texts, last = [c["choices"][0] for c in chunks]
        # The role chunk has no stop_reason; the others carry one, null until the end.
        assert role == {"index": 0, "delta": {"role": "assistant", "content": ""},
                        "logprobs": None, "finish_reason": None}
        assert list(role) == ["index", "delta", "logprobs", "finish_reason"]
        assert texts and all(list(t) == ["index", "delta", "logprobs", "finish_reason",
                                         "stop_reason"] for t in texts)
        assert all(list(t["delta"]) == ["content"] and t["finish_reason"] is None
                   and t["stop_reason"] is None and t["logprobs"] is None for t in texts)
        assert last == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length",
                        "stop_reason": None}


def test_completion_answer_and_stream(server: ServerProcess) -> None:
    body = post(server, "/v1/completions", {"prompt": "One, two,", "max_tokens": 2,
                                            "temperature": 0, "logprobs": 1}).json()
    assert list(body) == [*TOP, "usage"] and body["object"] == "text_completion"
    (choice,) = body["choices"]
    assert list(choice) == CHOICE_TEXT and choice["stop_reason"] is None
    assert list(choice["logprobs"]) == ["tokens", "token_logprobs", "top_logprobs", "text_offset"]
    for include_usage in (False, True):
        req = {"prompt": "One, two,", "max_tokens": 2, "temperature": 0, "stream": True}
        if include_usage:
            req["stream_options"] = {"include_usage": True}
        chunks = events(post(server, "/v1/completions", req))
        if include_usage:
            usage = chunks.pop()
            assert list(usage) == [*TOP, "usage"] and usage["choices"] == []
            assert all(c["usage"] is None for c in chunks)
        assert all(list(c) == [*TOP, *(["usage"] if include_usage else [])] for c in chunks)
        assert all(list(c["choices"][0]) == CHOICE_TEXT for c in chunks)
        assert all(c["choices"][0]["logprobs"] is None and c["choices"][0]["stop_reason"] is None
                   for c in chunks)
        assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"


def test_models_and_errors(server: ServerProcess) -> None:
    r = httpx.get(f"{server.base_url}/v1/models", headers=server.headers, timeout=TIMEOUT)
    body = r.json()
    assert list(body) == ["object", "data"] and body["object"] == "list"
    assert list(body["data"][0]) == ["id", "object", "created", "owned_by", "root",
                                     "max_model_len", "state"]
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json={"messages": CHAT, "n": 0},
                   headers=server.headers, timeout=TIMEOUT)
    assert r.status_code == 400
    assert r.json() == {"error": {"message": "n must be between 1 and 16, got 0.",
                                  "type": "invalid_request_error", "param": "n", "code": None}}
