"""Tool calling through the real server and the real `openai` client: forced calls
(tool_choice "required" or a named function) are grammar-constrained, so on the bundled
SmolLM2 (whose template knows no tools) they are still calls whose arguments validate
against the tool's schema; streamed calls assemble to the non-streamed ones; tool_choice auto
on it is served in the generic format."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from tests.support.server_api import TIMEOUT


class WeatherArgs(BaseModel):
    city: str = Field(max_length=30)
    unit: Literal["celsius", "fahrenheit"]


class AddArgs(BaseModel):
    a: int = Field(ge=-1000, le=1000)
    b: int = Field(ge=-1000, le=1000)


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": WeatherArgs.model_json_schema()}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers",
                                      "parameters": AddArgs.model_json_schema()}},
]
ARGS = {"get_weather": WeatherArgs, "add": AddArgs}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]
NAMED = {"type": "function", "function": {"name": "add"}}


def call(client: openai.OpenAI, model: str, tool_choice, **kw):
    # One call each unless a test asks for parallel calls: the 135M model, allowed several,
    # goes on calling until max_tokens.
    kw.setdefault("parallel_tool_calls", False)
    kw.setdefault("max_tokens", 120)
    return client.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                          tool_choice=tool_choice, temperature=0, **kw)


def assembled(client: openai.OpenAI, model: str, tool_choice, **kw) -> tuple[list, str]:
    """A streamed answer's tool calls, put together from their deltas, and its finish reason."""
    calls: dict[int, dict] = {}
    finish = None
    for chunk in call(client, model, tool_choice, stream=True, **kw):
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id is not None:
                    assert entry["id"] is None, "id is sent once"
                    entry["id"] = d.id
                if d.function.name is not None:
                    assert entry["name"] is None, "name is sent once"
                    entry["name"] = d.function.name
                entry["arguments"] += d.function.arguments or ""
            finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("tool_choice", ["required", NAMED], ids=["required", "named"])
def test_a_forced_call_has_arguments_that_validate(client, model, tool_choice) -> None:
    choice = call(client, model, tool_choice).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls
    for tc in choice.message.tool_calls:
        assert tc.id.startswith("call_") and tc.type == "function"
        ARGS[tc.function.name].model_validate_json(tc.function.arguments)


def test_a_named_choice_calls_that_function(client, model) -> None:
    calls = call(client, model, NAMED).choices[0].message.tool_calls
    assert [tc.function.name for tc in calls] == ["add"]


@pytest.mark.parametrize("tool_choice", ["required", NAMED], ids=["required", "named"])
def test_a_streamed_call_assembles_to_the_non_streamed_one(client, model, tool_choice) -> None:
    whole = call(client, model, tool_choice).choices[0].message.tool_calls
    streamed, finish = assembled(client, model, tool_choice)
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in streamed] == \
        [(tc.function.name, tc.function.arguments) for tc in whole]
    assert all(c["id"].startswith("call_") for c in streamed)


def test_without_parallel_tool_calls_there_is_one_call(client, model) -> None:
    calls = call(client, model, "required").choices[0].message.tool_calls
    assert len(calls) == 1


def test_with_parallel_tool_calls_there_may_be_several(client, model) -> None:
    choice = call(client, model, "required", parallel_tool_calls=True, max_tokens=160).choices[0]
    calls = choice.message.tool_calls
    assert len(calls) >= 2
    # Every call is valid but one cut short by max_tokens.
    complete = calls[:-1] if choice.finish_reason == "length" else calls
    for tc in complete:
        ARGS[tc.function.name].model_validate_json(tc.function.arguments)


def test_a_follow_up_turn_with_the_tool_result_is_answered(client, model) -> None:
    first = call(client, model, NAMED).choices[0].message
    tc = first.tool_calls[0]
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": tc.id, "type": "function",
             "function": {"name": tc.function.name, "arguments": tc.function.arguments}}]},
        {"role": "tool", "tool_call_id": tc.id, "content": json.dumps({"result": 5})},
    ]
    out = client.chat.completions.create(model=model, messages=history, temperature=0,
                                         max_tokens=16)
    assert out.choices[0].message.content


def _refusal(server, body: dict) -> str:
    r = httpx.post(f"{server.base_url}/v1/chat/completions", headers=server.headers,
                   json={"messages": ASK, "max_tokens": 8, **body}, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    return r.json()["error"]["message"]


def test_a_choice_naming_an_unknown_tool_gets_a_400(server) -> None:
    message = _refusal(server, {"tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "launch_rockets"}}})
    assert message == "tool_choice names the function 'launch_rockets', which is not in tools."


def test_a_forced_call_with_a_response_format_gets_a_400(server) -> None:
    message = _refusal(server, {"tools": TOOLS, "tool_choice": "required",
                                "response_format": {"type": "json_object"}})
    assert message.startswith("A forced tool_choice and an output constraint")


def test_a_tool_with_an_unsupported_schema_gets_a_400(server) -> None:
    tools = [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {
            "xs": {"type": "array", "uniqueItems": True}}}}}]
    message = _refusal(server, {"tools": tools, "tool_choice": "required"})
    assert "'uniqueItems' (at #/properties/xs)" in message and message.startswith("Tool 'f'")


def _front_end_tool(name: str, description: str, **properties: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "required": sorted(properties),
                       "properties": {k: {"type": v} for k, v in properties.items()}}}}


# Shaped like what Open WebUI (0.12) attaches to every chat message by default: a list of its
# built-in tools, tool_choice left to auto, no max_tokens.
FRONT_END_TOOLS = [
    _front_end_tool("search_web", "Search the web", query="string"),
    _front_end_tool("fetch_url", "Read a web page", url="string"),
    _front_end_tool("get_current_timestamp", "The current date and time"),
    _front_end_tool("search_notes", "Search the user's notes", query="string"),
    _front_end_tool("view_note", "Read one note", note_id="string"),
    _front_end_tool("search_memories", "Search what the user asked to remember", query="string"),
    _front_end_tool("add_memory", "Remember a fact", content="string"),
    _front_end_tool("search_chats", "Search earlier chats", query="string", count="integer"),
]


def test_a_front_ends_default_tools_on_a_model_without_a_tool_format_get_an_answer(
        client, model) -> None:
    """SmolLM2's template teaches no tool format: it is taught the generic one, so a front end
    that attaches tools to every message gets an answer (text or calls), not a 400."""
    r = client.chat.completions.create(model=model, messages=ASK, tools=FRONT_END_TOOLS,
                                       temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "tool_calls", "length")
    assert choice.message.content or choice.message.tool_calls
    for tool_call in choice.message.tool_calls or []:
        assert tool_call.function.name in {t["function"]["name"] for t in FRONT_END_TOOLS}
