"""Requests recorded from the real clients (tests/server/recorded/: Claude Code through
/v1/messages, Codex CLI through /v1/responses, texts anonymised, their lengths, structure, tool
names and schemas as the clients sent them; Open WebUI's chat message with its 28 built-in
tools and its follow-up task, both without max_tokens, through /v1/chat/completions;
Codex naming OpenAI's newest model, which brings its custom apply_patch tool),
replayed against a server: each is served, and its stream is what the client's SDK parses,
to its last event; a request without max_tokens stops at the server's default.

The server runs a tiny random-weight model with SmolLM2's chat template and a 16k window
(OFFICELLM_ALLOW_LONG_MAX_MODEL_LEN: past its trained 1,024 positions, which does not matter
for the shapes tested here): the agents' prompts are 3-5k tokens once their tools are
described, minutes of prefill for the bundled model on a CI box. Only max_tokens is lowered
(Claude Code asks for 64,000), and the recorded model names are the served one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from anthropic.types import RawMessageStreamEvent
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from officellm.engine.kv_plan import ALLOW_LONG_MAX_MODEL_LEN
from tests.support.server_api import TIMEOUT
from tests.support.server_process import ServerProcess
from tests.support.tiny_models import shared_tiny_model

RECORDED = Path(__file__).parent / "recorded"
MAX_TOKENS = 8
DEFAULT_MAX_TOKENS = 6  # the server's, for requests that name none (Open WebUI's)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path
           ) -> Iterator[ServerProcess]:
    """A tiny model served for the clients: Claude's and OpenAI's model names by alias, no
    context cap, a 16k window, a default max_tokens."""
    model = shared_tiny_model("llama", tmp_path_factory, smollm2_dir)
    with ServerProcess(str(model), "--max-model-len", "16384", "--max-context-tokens", "0",
                       "--model-alias", "claude-*", "--model-alias", "gpt-*",
                       "--default-max-tokens", str(DEFAULT_MAX_TOKENS),
                       env={ALLOW_LONG_MAX_MODEL_LEN: "1"}) as srv:
        yield srv


def served_model(server: ServerProcess) -> str:
    r = httpx.get(f"{server.base_url}/v1/models", headers=server.headers, timeout=TIMEOUT)
    return r.json()["data"][0]["id"]


def send(server: ServerProcess, name: str, body_changes: dict) -> list[str]:
    """The recorded request, sent as recorded (the test key in place of the client's): the
    lines of its answer, once it is all there."""
    record = json.loads((RECORDED / name).read_text())
    headers = {**record["headers"], **server.headers}
    url = f"{server.base_url}{record['path']}" + (f"?{record['query']}" if record["query"] else "")
    with httpx.stream("POST", url, json={**record["body"], **body_changes}, headers=headers,
                      timeout=TIMEOUT) as r:
        assert r.status_code == 200, r.read()
        return [line for line in r.iter_lines() if line]


def replay(server: ServerProcess, name: str, body_changes: dict) -> list[dict]:
    """The events of a recorded request's stream, each checked to be named on its own
    `event:` line (the Anthropic and Responses APIs' streams)."""
    lines = send(server, name, body_changes)
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    events = [json.loads(line.removeprefix("data: ")) for line in lines
              if line.startswith("data: ")]
    assert names == [e["type"] for e in events]
    return events


def test_claude_codes_request_is_served_as_anthropics_stream(server) -> None:
    events = replay(server, "claude_code_2.1.197.json", {"max_tokens": MAX_TOKENS})
    adapter = TypeAdapter(RawMessageStreamEvent)
    for event in events:
        if event["type"] != "ping":
            adapter.validate_python(event)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert events[-2]["delta"]["stop_reason"] in ("max_tokens", "end_turn", "tool_use")


def test_claude_codes_resent_prefix_is_read_from_the_prefix_cache(server) -> None:
    """Its per-request billing nonce does not reach the prompt (docs/clients.md)."""
    first = replay(server, "claude_code_2.1.197.json", {"max_tokens": 1})
    record = json.loads((RECORDED / "claude_code_2.1.197.json").read_text())
    system = [dict(b) for b in record["body"]["system"]]
    system[0]["text"] = system[0]["text"].replace("cch=00000", "cch=9f3a1")
    second = replay(server, "claude_code_2.1.197.json", {"max_tokens": 1, "system": system})
    prompt = first[-2]["usage"]["input_tokens"] + first[-2]["usage"]["cache_read_input_tokens"]
    assert second[-2]["usage"]["cache_read_input_tokens"] >= prompt - 16  # all but a block


def test_codexs_request_is_served_as_openais_stream(server) -> None:
    events = replay(server, "codex_0.171.0.json", {"max_output_tokens": MAX_TOKENS,
                                                   "model": served_model(server)})
    adapter = TypeAdapter(ResponseStreamEvent)
    for event in events:
        usage = event.get("response", {}).get("usage")
        if usage is not None:  # the engine does not count prompt tokens it writes to its cache
            usage["input_tokens_details"].setdefault("cache_write_tokens", 0)
        adapter.validate_python(event)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    echoed = {t["type"] for t in events[0]["response"]["tools"]}
    assert echoed == {"function", "namespace"}  # web_search left out
    assert "hosted tools left out (this server cannot run them): web_search" in server.output()


def test_codexs_request_for_openais_newest_model_is_served_with_apply_patch_as_a_custom_tool(
        server) -> None:
    """Named gpt-5.5, Codex sends apply_patch as a custom tool (its Lark grammar) and
    tool_search; the server's aliases map the name to the served model here."""
    events = replay(server, "codex_0.171.0_gpt-5.5.json", {"max_output_tokens": MAX_TOKENS})
    adapter = TypeAdapter(ResponseStreamEvent)
    for event in events:
        usage = event.get("response", {}).get("usage")
        if usage is not None:
            usage["input_tokens_details"].setdefault("cache_write_tokens", 0)
        adapter.validate_python(event)
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    echoed = {(t["type"], t["name"]) for t in events[0]["response"]["tools"]}
    assert ("custom", "apply_patch") in echoed
    assert "hosted tools left out (this server cannot run them): tool_search, web_search" in \
        server.output()


def test_open_webuis_chat_message_with_its_builtin_tools_is_served_as_openais_stream(
        server) -> None:
    lines = send(server, "open_webui_0.12.4_chat.json", {"model": served_model(server)})
    assert lines[-1] == "data: [DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(line.removeprefix("data: "))
              for line in lines[:-1]]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    assert finish in (["stop"], ["length"], ["tool_calls"])
    record = json.loads((RECORDED / "open_webui_0.12.4_chat.json").read_text())
    offered = {t["function"]["name"] for t in record["body"]["tools"]}
    called = {call.function.name for c in chunks for call in c.choices[0].delta.tool_calls or []
              if call.function and call.function.name}
    assert called <= offered


def test_open_webuis_task_without_max_tokens_stops_at_the_servers_default(server) -> None:
    (line,) = send(server, "open_webui_0.12.4_follow_ups.json", {"model": served_model(server)})
    answer = ChatCompletion.model_validate_json(line)
    assert answer.usage.completion_tokens <= DEFAULT_MAX_TOKENS
    assert answer.choices[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("name", sorted(p.name for p in RECORDED.glob("*.json")))
def test_the_recordings_carry_no_secret(name: str) -> None:
    text = (RECORDED / name).read_text()
    record = json.loads(text)
    assert not {"authorization", "x-api-key"} & set(record["headers"])
    assert "sk-" not in text and "ocl-" not in text
