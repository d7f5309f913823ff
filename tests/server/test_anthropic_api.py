"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) through the real
server and the real `anthropic` client: text, the answer the chat route gives, stop reasons,
streaming, forced tool calls and their follow-up, output formats, prefill, token counts, the
prefix cache under Claude Code's billing block, model aliases, both ways of sending the key,
and every refusal in Anthropic's error shape.

Greedy throughout (temperature 0), so answers can be compared across routes and modes. The
bundled SmolLM2's template knows no tools: forced calls (tool_choice any or tool) are
grammar-constrained, as on the chat route.
"""

from __future__ import annotations

import json
import uuid

import anthropic
import httpx
import openai
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import BaseModel, Field, TypeAdapter

from tests.support.openai_errors import anthropic_error
from tests.support.server_api import TIMEOUT, sample, scrape_idle
from tests.support.server_process import ServerProcess

ASK = "What is the capital of France?"
CALC = "What is 2 + 3? Use the add tool."
BILLING = "x-anthropic-billing-header: cc_version=2.1.328; cc_entrypoint=cli; cch={};"


class AddArgs(BaseModel):
    a: int = Field(ge=-1000, le=1000)
    b: int = Field(ge=-1000, le=1000)


ADD = {"name": "add", "description": "Add two integers",
       "input_schema": AddArgs.model_json_schema()}


@pytest.fixture(scope="module")
def claude(server: ServerProcess) -> anthropic.Anthropic:
    """The real `anthropic` client with the server's key (sent as x-api-key, as it does)."""
    return anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key,
                               timeout=TIMEOUT, max_retries=0)


# The anthropic client (2.x) has no sampling arguments (Anthropic's current models take none),
# but the API still does, and so does this server: greedy goes in the body.
GREEDY = {"temperature": 0}


def create(claude: anthropic.Anthropic, model: str, **kw) -> Message:
    kw.setdefault("messages", [{"role": "user", "content": ASK}])
    kw.setdefault("max_tokens", 12)
    kw["extra_body"] = {**GREEDY, **kw.get("extra_body", {})}
    return claude.messages.create(model=model, **kw)


def text_of(message: Message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def post(server: ServerProcess, path: str, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=TIMEOUT,
                      headers={"x-api-key": server.api_key or "", **headers})


# -- text ----------------------------------------------------------------------------------

def test_a_text_message_gets_an_assistant_message(claude, model) -> None:
    m = create(claude, model)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert m.model == model
    assert [b.type for b in m.content] == ["text"] and text_of(m)
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None


def test_the_answer_is_the_chat_routes_for_the_same_conversation(claude, client, model) -> None:
    system = "Answer in one short sentence."
    m = create(claude, model, system=system)
    chat = client.chat.completions.create(
        model=model, temperature=0, max_tokens=12,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": ASK}])
    assert text_of(m) == chat.choices[0].message.content
    assert m.usage.output_tokens == chat.usage.completion_tokens
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == chat.usage.prompt_tokens


def test_the_token_limit_stops_it_with_max_tokens(claude, model) -> None:
    m = create(claude, model, max_tokens=3)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_a_stop_sequence_stops_it_and_is_named(claude, model) -> None:
    words = text_of(create(claude, model)).split()
    stop = words[min(2, len(words) - 1)]
    m = create(claude, model, stop_sequences=[stop])
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", stop)
    assert stop not in text_of(m)


def test_usage_is_what_the_engine_counted(server, claude, model) -> None:
    before = scrape_idle(server)
    m = create(claude, model)
    after = scrape_idle(server)

    def delta(metric: str, **labels: str) -> float:
        return sample(after, metric, **labels) - sample(before, metric, **labels)

    name = {"model_name": model}
    prompt = m.usage.input_tokens + m.usage.cache_read_input_tokens
    assert prompt == delta("vllm:prompt_tokens_total", **name) > 0
    assert m.usage.output_tokens == delta("vllm:generation_tokens_total", **name) > 0
    assert delta("officellm:requests_total", **name, user="key1") == 1


# -- streaming -----------------------------------------------------------------------------

def test_a_streamed_message_assembles_to_the_whole_one(claude, model) -> None:
    whole = create(claude, model)
    with claude.messages.stream(model=model, max_tokens=12, extra_body=GREEDY,
                                messages=[{"role": "user", "content": ASK}]) as stream:
        streamed = stream.get_final_message()
    assert text_of(streamed) == text_of(whole)
    assert streamed.stop_reason == whole.stop_reason
    assert streamed.usage.output_tokens == whole.usage.output_tokens


def _events(server: ServerProcess, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{server.base_url}/v1/messages", json={**body, "stream": True},
                      headers={"x-api-key": server.api_key or ""}, timeout=TIMEOUT) as r:
        assert r.status_code == 200
        lines = list(r.iter_lines())
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    events = [json.loads(line.removeprefix("data: ")) for line in lines
              if line.startswith("data: ")]
    assert names == [e["type"] for e in events]  # each event named on its own line
    return events


def test_the_stream_is_anthropics_event_sequence(server, model) -> None:
    events = _events(server, {"model": model, "max_tokens": 4, "temperature": 0,
                              "messages": [{"role": "user", "content": ASK}]})
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    adapter = TypeAdapter(RawMessageStreamEvent)
    for event in events:
        adapter.validate_python(event)
    assert events[0]["message"]["usage"]["input_tokens"] > 0
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"
    assert events[-2]["usage"]["output_tokens"] == 4


# -- tools ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def add_call(claude, model) -> Message:
    """The answer to CALC with the add tool forced by name (one call, shared by two tests)."""
    return create(claude, model, messages=[{"role": "user", "content": CALC}], tools=[ADD],
                  tool_choice={"type": "tool", "name": "add"}, max_tokens=80)


def test_a_named_tool_is_called_with_input_matching_its_schema(add_call) -> None:
    m = add_call
    (call,) = [b for b in m.content if b.type == "tool_use"]
    assert call.name == "add" and call.id.startswith("toolu_")
    AddArgs.model_validate(call.input)
    assert m.stop_reason == "tool_use"


def test_a_streamed_call_assembles_to_the_whole_calls_input(claude, model) -> None:
    kw = {"messages": [{"role": "user", "content": CALC}], "tools": [ADD], "max_tokens": 80,
          "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}
    whole = create(claude, model, **kw)
    with claude.messages.stream(model=model, extra_body=GREEDY, **kw) as stream:
        streamed = stream.get_final_message()
    calls = [(b.name, b.input) for m in (whole, streamed) for b in m.content
             if b.type == "tool_use"]
    assert len(calls) == 2 and calls[0] == calls[1]
    assert streamed.stop_reason == "tool_use"


def test_a_tool_result_turn_is_answered_in_text(claude, model, add_call) -> None:
    call = add_call
    use = next(b for b in call.content if b.type == "tool_use")
    m = create(claude, model, tools=[ADD], tool_choice={"type": "none"}, messages=[
        {"role": "user", "content": CALC},
        {"role": "assistant", "content": [b.model_dump() for b in call.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "5"}]}])
    assert [b.type for b in m.content] == ["text"] and text_of(m)


def test_a_tool_choice_naming_no_given_tool_is_refused(server, model) -> None:
    r = post(server, "/v1/messages", {"model": model, "max_tokens": 8, "tools": [ADD],
                                      "messages": [{"role": "user", "content": CALC}],
                                      "tool_choice": {"type": "tool", "name": "mul"}})
    assert "'mul'" in anthropic_error(r, 400, "invalid_request_error")


def test_a_server_tool_is_refused_naming_its_type(server, model) -> None:
    tool = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
    r = post(server, "/v1/messages", {"model": model, "max_tokens": 8, "tools": [tool],
                                      "messages": [{"role": "user", "content": ASK}]})
    assert "'web_search_20250305'" in anthropic_error(r, 400, "invalid_request_error")


# -- the request's other fields -------------------------------------------------------------

def test_an_output_format_holds_the_answer_to_its_schema(claude, model) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
              "required": ["city"], "additionalProperties": False}
    m = create(claude, model, max_tokens=40,
               extra_body={"output_config": {"format": {"type": "json_schema",
                                                        "schema": schema}}})
    assert set(json.loads(text_of(m))) == {"city"}


def test_a_last_assistant_message_is_continued(claude, client, model) -> None:
    start = "The capital of France is"
    conversation = [{"role": "user", "content": ASK}, {"role": "assistant", "content": start}]
    m = create(claude, model, messages=conversation, max_tokens=6)
    chat = client.chat.completions.create(
        model=model, messages=conversation, temperature=0, max_tokens=6,
        extra_body={"add_generation_prompt": False,
                    "chat_template_kwargs": {"continue_final_message": True}})
    assert text_of(m) == chat.choices[0].message.content


def test_fields_that_change_nothing_here_are_accepted(claude, model) -> None:
    m = create(claude, model, max_tokens=2, metadata={"user_id": "session-1"},
               service_tier="auto", thinking={"type": "disabled"},
               system=[{"type": "text", "text": "Be brief.",
                        "cache_control": {"type": "ephemeral"}}],
               extra_body={"context_management": {"edits": []},
                           "output_config": {"effort": "low"}})
    assert m.usage.output_tokens == 2


def test_an_unknown_field_is_refused_naming_it(server, model) -> None:
    r = post(server, "/v1/messages", {"model": model, "max_tokens": 8, "mcp_servers": [],
                                      "messages": [{"role": "user", "content": ASK}]})
    assert "'mcp_servers'" in anthropic_error(r, 400, "invalid_request_error")


def test_an_image_block_on_a_model_without_vision_is_refused_naming_it(server, model) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}
    r = post(server, "/v1/messages", {"model": model, "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]})
    message = anthropic_error(r, 400, "invalid_request_error")
    assert f"Model {model!r} has no vision" in message


def test_a_document_block_is_refused_naming_where_it_is(server, model) -> None:
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                               "data": "a memo"}}
    r = post(server, "/v1/messages", {"model": model, "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Summarise"}, document]}]})
    message = anthropic_error(r, 400, "invalid_request_error")
    assert "'document'" in message and "messages.0.content.1" in message


def test_a_missing_max_tokens_is_a_400_naming_it(server, model) -> None:
    r = post(server, "/v1/messages", {"model": model,
                                      "messages": [{"role": "user", "content": ASK}]})
    assert "max_tokens" in anthropic_error(r, 400, "invalid_request_error")


def test_a_prompt_over_the_window_is_an_invalid_request(server, model) -> None:
    long = "word " * 9000
    r = post(server, "/v1/messages", {"model": model, "max_tokens": 8,
                                      "messages": [{"role": "user", "content": long}]})
    anthropic_error(r, 400, "invalid_request_error")
    assert create_ok(server, model)  # the next request is served


def create_ok(server: ServerProcess, model: str) -> bool:
    r = post(server, "/v1/messages", {"model": model, "max_tokens": 2,
                                      "messages": [{"role": "user", "content": ASK}]})
    return r.status_code == 200


# -- counting and the prefix cache ----------------------------------------------------------

def test_count_tokens_is_the_prompt_the_message_runs(claude, model) -> None:
    kw = {"system": "Answer briefly.", "messages": [{"role": "user", "content": ASK}]}
    counted = claude.messages.count_tokens(model=model, **kw).input_tokens
    m = create(claude, model, **kw)
    assert counted == m.usage.input_tokens + m.usage.cache_read_input_tokens > 0


def test_count_tokens_counts_the_tools_a_template_is_told_of(claude, model) -> None:
    kw = {"messages": [{"role": "user", "content": CALC}]}
    bare = claude.messages.count_tokens(model=model, **kw).input_tokens
    with_tools = claude.messages.count_tokens(model=model, tools=[ADD],
                                              tool_choice={"type": "any"}, **kw).input_tokens
    assert with_tools > bare


def _agent_system(nonce: str, instructions: str) -> list[dict]:
    return [{"type": "text", "text": BILLING.format(nonce)},
            {"type": "text", "text": instructions}]


def test_the_billing_block_is_not_part_of_the_prompt(claude, model) -> None:
    instructions = "You are a coding agent. Be exact."
    counts = {claude.messages.count_tokens(model=model, system=system,
                                           messages=[{"role": "user", "content": ASK}]
                                           ).input_tokens
              for system in (_agent_system("1a2b3", instructions),
                             _agent_system("9f8e7", instructions), instructions)}
    assert len(counts) == 1


def test_a_resent_agent_prefix_is_read_from_the_prefix_cache(claude, model) -> None:
    """Claude Code's nonce differs on every request; the second still hits the cache."""
    instructions = f"Session {uuid.uuid4()}. " + "Follow the house style. " * 12
    first, second = (create(claude, model, max_tokens=1, system=_agent_system(nonce,
                                                                              instructions))
                     for nonce in ("c0ffee", "beef42"))
    assert first.usage.cache_read_input_tokens == 0
    assert second.usage.cache_read_input_tokens >= 64
    assert (second.usage.input_tokens + second.usage.cache_read_input_tokens
            == first.usage.input_tokens)


# -- model names and keys -------------------------------------------------------------------

def test_claude_model_names_reach_the_served_model_by_alias(claude, model) -> None:
    m = create(claude, "claude-sonnet-4-5-20250929", max_tokens=2)
    assert m.model == model


def test_a_model_matching_no_alias_is_not_found(server) -> None:
    r = post(server, "/v1/messages", {"model": "gpt-5", "max_tokens": 2,
                                      "messages": [{"role": "user", "content": ASK}]})
    anthropic_error(r, 404, "not_found_error")


def test_the_key_may_come_as_a_bearer_token(server, model) -> None:
    claude = anthropic.Anthropic(base_url=server.base_url, auth_token=server.api_key,
                                 timeout=TIMEOUT, max_retries=0)
    assert create(claude, model, max_tokens=1).usage.output_tokens == 1


def test_a_wrong_key_is_an_authentication_error(server, model) -> None:
    claude = anthropic.Anthropic(base_url=server.base_url, api_key="sk-wrong", timeout=TIMEOUT,
                                 max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        create(claude, model, max_tokens=1)
    assert caught.value.body["error"]["type"] == "authentication_error"


def test_claude_codes_beta_query_and_headers_are_accepted(server, model) -> None:
    r = post(server, "/v1/messages?beta=true",
             {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": ASK}]},
             **{"anthropic-version": "2023-06-01",
                "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"})
    assert r.status_code == 200, r.text
    Message.model_validate(r.json())


def test_the_openai_routes_keep_openais_error_shape(client, model) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-5", messages=[{"role": "user",
                                                                 "content": ASK}])
    assert caught.value.body["type"] == "invalid_request_error"
