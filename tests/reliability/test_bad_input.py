"""Bad input by hand: each gets a clear 4xx in its API's shape (OpenAI's, Anthropic's on
/v1/messages), never a crash, and none of it reaches the engine as a fault (the log stays free
of ERRORs, the server stays healthy). And one thing that is not bad input: a max_tokens past
the context window, which runs to the window.

One real server with a 1 MiB body limit (--max-request-bytes) over a tiny model, 256 tokens of
context.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.reliability.probes import error_lines
from tests.support.openai_errors import anthropic_error, openai_error
from tests.support.server_process import ServerProcess

LIMIT = 1024 * 1024
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
WINDOW = 256
USER = [{"role": "user", "content": "hi"}]
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    with ServerProcess(str(tiny_model_dir), "--max-model-len", str(WINDOW),
                       "--max-request-bytes", str(LIMIT)) as srv:
        yield srv


def post_raw(server: ServerProcess, path: str, content: bytes) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", content=content,
                      headers=server.headers | JSON, timeout=60)


def post(server: ServerProcess, path: str, body: object) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers=server.headers, timeout=60)


def test_a_10_mb_body_is_refused_with_413_before_it_is_read(server: ServerProcess) -> None:
    body = b'{"messages": [{"role": "user", "content": "' + b"a" * (10 * 1024 * 1024) + b'"}]}'
    t0 = time.monotonic()
    err = openai_error(post_raw(server, CHAT, body), 413)
    assert f"{LIMIT:,} bytes" in err["message"] and err["code"] == "request_too_large"
    assert time.monotonic() - t0 < 10


def test_a_body_just_under_the_configured_limit_is_read(server: ServerProcess) -> None:
    body = {"messages": [{"role": "user", "content": "a " * (LIMIT // 2 - 100)}], "max_tokens": 1}
    err = openai_error(post(server, CHAT, body), 400)  # read and parsed: only too long for the model
    assert err["code"] == "context_length_exceeded"


@pytest.mark.parametrize("body, fragment", [
    (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not valid JSON"),
    (b'{"messages": [{"role": "user", "content": "x", "meta": ' + b'{"a": ' * 50_000 + b"1"
     + b"}" * 50_000 + b"}]}", "not valid JSON"),
    (b'{"messages": [{"role": "user", "content": "\xff\xfe\xfd"}]}', "not valid JSON"),
    (b'{"messages": [{"role": "user", "content": "x"', "not valid JSON"),
    (b"", "Field required"),
], ids=["deeply-nested-lists", "deeply-nested-objects", "invalid-utf8", "truncated-json",
        "empty-body"])
def test_malformed_bodies_get_400(server: ServerProcess, body: bytes, fragment: str) -> None:
    assert fragment in openai_error(post_raw(server, CHAT, body), 400)["message"]


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "presence_penalty",
                                   "frequency_penalty", "repetition_penalty", "max_tokens"])
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_in_numbers_get_400(server: ServerProcess, field: str,
                                             value: str) -> None:
    body = f'{{"messages": [{{"role": "user", "content": "x"}}], "{field}": {value}}}'
    err = openai_error(post_raw(server, CHAT, body.encode()), 400)
    assert err["param"] == field


@pytest.mark.parametrize("path, body, fragment", [
    (CHAT, {"messages": USER, "max_tokens": -5}, "max_tokens must be at least 1, got -5"),
    (CHAT, {"messages": USER, "max_tokens": 0}, "max_tokens must be at least 1, got 0"),
    (CHAT, {"messages": USER, "max_completion_tokens": 0},
     "max_completion_tokens must be at least 1, got 0"),
    (CHAT, {"messages": USER, "n": 17}, "n must be between 1 and 16, got 17"),
    (CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 21},
     "top_logprobs must be between 0 and 20, got 21"),
    (COMPLETIONS, {"prompt": "x", "logprobs": 21}, "logprobs must be between 0 and 20, got 21"),
    (CHAT, {"messages": []}, "at least 1 item"),
    (CHAT, {"messages": "hello"}, "valid list"),
    (CHAT, {"messages": [{"content": "no role"}]}, "Field required"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "An image_url part is"),
    (CHAT, {"messages": USER, "seed": 2**70}, "seed must be a 64-bit integer"),
    (CHAT, {"messages": USER, "top_k": 10**30}, "top_k must be at most"),
    (CHAT, {"messages": USER, "min_tokens": 9, "max_tokens": 8}, "must not exceed max_tokens"),
    (COMPLETIONS, {"prompt": []}, "The prompt is empty"),
    (COMPLETIONS, {"prompt": [[]]}, "The prompt is empty"),
    (COMPLETIONS, {"prompt": [10**20]}, "Prompt token ids must be in"),
    (COMPLETIONS, {"prompt": [-1]}, "Prompt token ids must be in"),
    (CHAT, [1, 2], "valid dictionary"),
], ids=["negative-max-tokens", "zero-max-tokens", "zero-max-completion-tokens",
        "n-over-16",
        "top-logprobs-over-20", "completion-logprobs-over-20", "empty-messages",
        "messages-not-a-list", "message-without-role", "image-content", "seed-over-64-bits",
        "huge-top-k", "min-tokens-over-max", "empty-prompt", "empty-nested-prompt",
        "token-id-over-vocab", "negative-token-id", "body-not-an-object"])
def test_out_of_range_values_get_a_clear_400(server: ServerProcess, path: str, body: object,
                                             fragment: str) -> None:
    assert fragment in openai_error(post(server, path, body), 400)["message"]


def test_anthropic_bad_input_gets_a_400_in_anthropics_shape(server: ServerProcess) -> None:
    message = anthropic_error(post_raw(server, MESSAGES, b'{"max_tokens": 1, "messages": ['),
                              400, "invalid_request_error")
    assert "not valid JSON" in message


@pytest.mark.parametrize("path", [MESSAGES, f"{MESSAGES}/count_tokens"])
@pytest.mark.parametrize("field", ["tools", "messages"])
def test_anthropic_fields_that_are_no_list_get_a_400_not_a_500(server: ServerProcess, path: str,
                                                               field: str) -> None:
    """Found by the schema fuzzer: `"tools": true` reached a loop over the tools (a 500)."""
    body = {"model": "m", "max_tokens": 1, "messages": USER, field: True}
    if path.endswith("count_tokens"):
        body.pop("max_tokens")
    anthropic_error(post(server, path, body), 400, "invalid_request_error")


def test_a_max_tokens_past_the_window_runs_to_the_window(server: ServerProcess) -> None:
    """Clamped to the room the prompt leaves, not refused: clients that always send a large
    max_tokens (Anthropic's, agents) are served; finish_reason "length" says it was cut."""
    r = post(server, CHAT, {"messages": USER, "max_tokens": 10**30, "ignore_eos": True,
                            "temperature": 0})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == WINDOW


def test_anthropic_says_the_window_stopped_it(server: ServerProcess) -> None:
    r = post(server, MESSAGES, {"messages": USER, "max_tokens": 32000, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    usage = body["usage"]
    assert body["stop_reason"] == "model_context_window_exceeded"
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["output_tokens"] \
        == WINDOW


def test_a_prompt_over_the_window_is_still_refused(server: ServerProcess) -> None:
    long = [{"role": "user", "content": "word " * (2 * WINDOW)}]
    err = openai_error(post(server, CHAT, {"messages": long, "max_tokens": 1}), 400)
    assert err["code"] == "context_length_exceeded"
    message = anthropic_error(post(server, MESSAGES, {"messages": long, "max_tokens": 1}), 400,
                              "invalid_request_error")
    assert f"maximum context length is {WINDOW} tokens" in message


def _schema_bounds(server: ServerProcess, model: str) -> dict[str, tuple[str, dict]]:
    """Each bounded number field of `model` in the served /openapi.json: (type, bounds)."""
    schema = httpx.get(f"{server.base_url}/openapi.json", timeout=10).json()
    out = {}
    for name, prop in schema["components"]["schemas"][model]["properties"].items():
        for branch in prop.get("anyOf", [prop]):
            bounds = {k: branch[k] for k in ("minimum", "exclusiveMinimum", "maximum",
                                             "exclusiveMaximum") if k in branch}
            if bounds:
                out[name] = (branch["type"], bounds)
    return out


def _edges(kind: str, bounds: dict) -> list[tuple[float, bool]]:
    """(value, valid) on each side of each documented bound."""
    step = 1 if kind == "integer" else 0.001
    b = {k: int(v) if kind == "integer" else v for k, v in bounds.items()}  # exact, for ints
    out = []
    if "minimum" in b:
        out += [(b["minimum"], True), (b["minimum"] - step, False)]
    if "exclusiveMinimum" in b:
        out += [(b["exclusiveMinimum"] + step, True), (b["exclusiveMinimum"], False)]
    if "maximum" in b:
        out += [(b["maximum"], True), (b["maximum"] + step, False)]
    if "exclusiveMaximum" in b:
        out += [(b["exclusiveMaximum"] - step, True), (b["exclusiveMaximum"], False)]
    return out


@pytest.mark.parametrize("path, model, base, expected", [
    (CHAT, "ChatCompletionRequest", {"messages": USER, "logprobs": True},
     {"n", "temperature", "top_p", "min_p", "seed", "top_k", "presence_penalty",
      "frequency_penalty", "repetition_penalty", "max_tokens", "max_completion_tokens",
      "min_tokens", "top_logprobs"}),
    (COMPLETIONS, "CompletionRequest", {"prompt": "x"},
     {"n", "temperature", "top_p", "min_p", "seed", "top_k", "presence_penalty",
      "frequency_penalty", "repetition_penalty", "max_tokens", "min_tokens", "logprobs"}),
    # max_tokens means nothing here (it is ignored): max_output_tokens keeps answers short.
    (RESPONSES, "ResponsesRequest", {"input": "hi", "max_output_tokens": 1},
     {"temperature", "top_p", "max_output_tokens"}),
    (MESSAGES, "MessagesRequest", {"messages": USER},
     {"temperature", "top_p", "top_k", "max_tokens"}),
], ids=["chat", "completions", "responses", "messages"])
def test_the_documented_bounds_are_the_enforced_ones(server: ServerProcess, path: str,
                                                     model: str, base: dict,
                                                     expected: set[str]) -> None:
    """What /openapi.json shows is what the server does: a value on a documented bound is
    accepted, one just past it is a 400 naming the field in the message (and in OpenAI's
    `param`)."""
    fields = _schema_bounds(server, model)
    assert set(fields) == expected
    wrong = []
    for name, (kind, bounds) in sorted(fields.items()):
        for value, valid in _edges(kind, bounds):
            body = {**base, "max_tokens": 1, name: value}
            r = post(server, path, body)
            if valid:
                if r.status_code != 200:
                    wrong.append(f"{name}={value}: {r.status_code} {r.text[:200]}")
            elif r.status_code != 400 or name not in r.json()["error"]["message"] \
                    or (path != MESSAGES and r.json()["error"]["param"] != name):
                # Anthropic's error shape has no `param`: the message names the field.
                wrong.append(f"{name}={value}: {r.status_code} {r.text[:200]}")
    assert wrong == []


def test_none_of_it_reached_the_engine_as_a_fault(server: ServerProcess) -> None:
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
    r = post(server, CHAT, {"messages": USER, "max_tokens": 3, "seed": -1, "top_k": 10**9})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert error_lines(server.output()) == []
