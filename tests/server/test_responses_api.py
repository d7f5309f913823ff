"""The Responses API (POST /v1/responses) through the real server and the real `openai`
client: text, instructions, structured output, function calls and their follow-up turn,
streaming, cut responses, usage; and the 400s of a server that stores nothing.

Greedy throughout (temperature 0), so a streamed answer can be compared with the whole one.
The bundled SmolLM2's template knows no tools: forced calls ("required", a named function)
are grammar-constrained, and tool_choice "auto" is taught the generic format, as on the chat
route.
"""

from __future__ import annotations

import json
import re
from typing import Literal

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, Field, TypeAdapter

from tests.support.openai_errors import openai_error
from tests.support.server_api import TIMEOUT, sample, scrape
from tests.support.server_process import ServerProcess

ASK = "What is the capital of France?"


class AddArgs(BaseModel):
    a: int = Field(ge=-1000, le=1000)
    b: int = Field(ge=-1000, le=1000)


class Ticket(BaseModel):
    priority: Literal["low", "normal", "high"]
    urgent: bool


ADD = {"type": "function", "name": "add", "description": "Add two integers",
       "parameters": AddArgs.model_json_schema()}
CALC = "What is 2 + 3? Use the add tool."


def create(client: openai.OpenAI, model: str, **kw):
    kw.setdefault("input", ASK)
    kw.setdefault("max_output_tokens", 24)
    return client.responses.create(model=model, temperature=0, **kw)


def call_add(client: openai.OpenAI, model: str, **kw):
    # One call: the 135M model, allowed several, goes on calling until max_output_tokens.
    return create(client, model, input=CALC, tools=[ADD], parallel_tool_calls=False,
                  max_output_tokens=80, **kw)


def function_calls(response) -> list:
    return [item for item in response.output if item.type == "function_call"]


def post(server: ServerProcess, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/responses", headers=server.headers,
                      json={"input": ASK, "max_output_tokens": 4, **body}, timeout=TIMEOUT)


# -- text ----------------------------------------------------------------------------------

def test_a_text_input_gets_a_completed_message(client, model) -> None:
    r = create(client, model)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == model
    assert r.status == "completed" and r.incomplete_details is None
    (message,) = r.output
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.status == "completed"
    assert [part.type for part in message.content] == ["output_text"]
    assert r.output_text and r.output_text == message.content[0].text


def test_usage_is_what_the_engine_counted(server, client, model) -> None:
    before = scrape(server)
    r = create(client, model)
    after = scrape(server)

    def delta(metric: str, **labels: str) -> float:
        return sample(after, metric, **labels) - sample(before, metric, **labels)

    name = {"model_name": model}
    assert r.usage.input_tokens == delta("vllm:prompt_tokens_total", **name) > 0
    assert r.usage.output_tokens == delta("vllm:generation_tokens_total", **name) > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert delta("officellm:requests_total", **name, user="key1") == 1


def test_instructions_are_the_prompts_system_message(server, client, model) -> None:
    instructions = "Answer in one word, in French, without punctuation."
    r = create(client, model, instructions=instructions, max_output_tokens=1)
    chat = [{"role": "system", "content": instructions}, {"role": "user", "content": ASK}]
    counted = httpx.post(f"{server.base_url}/tokenize", headers=server.headers,
                         json={"messages": chat}, timeout=TIMEOUT).json()["count"]
    assert r.instructions == instructions
    assert r.usage.input_tokens == counted


def test_a_repeated_input_reports_its_cached_tokens(client, model) -> None:
    ask = "Repeat after me: " + "the quick brown fox jumps over the lazy dog " * 4
    create(client, model, input=ask, max_output_tokens=1)
    again = create(client, model, input=ask, max_output_tokens=1)
    assert 0 < again.usage.input_tokens_details.cached_tokens < again.usage.input_tokens


def test_the_request_settings_are_echoed_and_nothing_is_stored(client, model) -> None:
    r = create(client, model, store=True, metadata={"case": "echo"}, max_output_tokens=2,
               top_p=0.5)
    assert (r.temperature, r.top_p, r.max_output_tokens) == (0.0, 0.5, 2)
    assert r.metadata == {"case": "echo"} and r.tools == [] and r.tool_choice == "auto"
    assert r.to_dict()["store"] is False and r.previous_response_id is None


def _as_openai_knows_it(body: dict) -> dict:
    # input_tokens_details.cache_write_tokens is left out: the engine does not count the
    # prompt tokens it writes to its prefix cache, and a made-up 0 would be wrong.
    usage = body.get("usage") or (body.get("response") or {}).get("usage")
    if usage is not None:
        usage["input_tokens_details"].setdefault("cache_write_tokens", 0)
    return body


def test_the_answer_and_each_event_validate_as_the_openai_packages_types(server, model) -> None:
    body = {"model": model, "input": CALC, "tools": [ADD], "tool_choice": "required",
            "parallel_tool_calls": False, "max_output_tokens": 80, "temperature": 0}
    whole = post(server, body)
    assert whole.status_code == 200, whole.text
    Response.model_validate(_as_openai_knows_it(whole.json()))
    with httpx.stream("POST", f"{server.base_url}/v1/responses", json={**body, "stream": True},
                      headers=server.headers, timeout=TIMEOUT) as r:
        events = [json.loads(line.removeprefix("data: ")) for line in r.iter_lines()
                  if line.startswith("data: ")]
    adapter = TypeAdapter(ResponseStreamEvent)
    for event in events:
        adapter.validate_python(_as_openai_knows_it(event))
    assert events[-1]["type"] == "response.completed"


# -- structured output ---------------------------------------------------------------------

def test_parse_returns_a_parsed_object(client, model) -> None:
    r = client.responses.parse(model=model, input="File a ticket as JSON.", text_format=Ticket,
                               temperature=0, max_output_tokens=60)
    assert r.status == "completed"
    assert isinstance(r.output_parsed, Ticket)


def test_a_streamed_parse_returns_the_same_object(client, model) -> None:
    whole = client.responses.parse(model=model, input="File a ticket as JSON.",
                                   text_format=Ticket, temperature=0, max_output_tokens=60)
    with client.responses.stream(model=model, input="File a ticket as JSON.", text_format=Ticket,
                                 temperature=0, max_output_tokens=60) as stream:
        final = stream.get_final_response()
    assert final.output_parsed == whole.output_parsed


# -- function calls ------------------------------------------------------------------------

@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "add"}],
                         ids=["required", "named"])
def test_a_forced_call_is_a_function_call_whose_arguments_validate(client, model,
                                                                   tool_choice) -> None:
    r = call_add(client, model, tool_choice=tool_choice)
    assert r.status == "completed"
    (call,) = function_calls(r)
    assert call.name == "add" and call.status == "completed"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    AddArgs.model_validate_json(call.arguments)


def test_a_forced_call_is_counted_by_kind(server, client, model) -> None:
    def count() -> float:
        return sample(scrape(server), "officellm:structured_requests_total",
                      kind="tool_required", model_name=model)

    before = count()
    call_add(client, model, tool_choice="required")
    assert count() == before + 1


def test_a_follow_up_with_the_call_and_its_output_is_answered(client, model) -> None:
    first = call_add(client, model, tool_choice={"type": "function", "name": "add"})
    (call,) = function_calls(first)
    # What an agent sends back: its input, the output items as they came, the call's result.
    history = [{"role": "user", "content": CALC}, *[item.to_dict() for item in first.output],
               {"type": "function_call_output", "call_id": call.call_id,
                "output": json.dumps({"result": 5})}]
    assert create(client, model, input=history, max_output_tokens=16).output_text


def test_tool_choice_auto_on_a_model_without_a_tool_format_is_answered(server) -> None:
    """The generic tool format (docs/clients.md, Tools): an answer, text or calls."""
    r = post(server, {"tools": [ADD], "max_output_tokens": 24})
    assert r.status_code == 200, r.text
    assert r.json()["output"]


# -- streaming -----------------------------------------------------------------------------

def test_streamed_text_deltas_assemble_to_the_non_streamed_text(client, model) -> None:
    whole = create(client, model)
    events = list(create(client, model, stream=True))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    done = [e.text for e in events if e.type == "response.output_text.done"]
    assert done == [whole.output_text]


def test_a_stream_is_numbered_and_ends_with_the_completed_response(client, model) -> None:
    events = list(create(client, model, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    last = events[-1]
    assert last.type == "response.completed" and last.response.status == "completed"
    assert last.response.usage.output_tokens > 0
    assert last.response.output_text == "".join(
        e.delta for e in events if e.type == "response.output_text.delta")


def test_streamed_call_arguments_assemble_to_the_non_streamed_ones(client, model) -> None:
    (whole,) = function_calls(call_add(client, model, tool_choice="required"))
    events = list(call_add(client, model, tool_choice="required", stream=True))
    added = [e.item for e in events if e.type == "response.output_item.added"
             and e.item.type == "function_call"]
    assert [item.name for item in added] == ["add"]
    arguments = "".join(e.delta for e in events
                        if e.type == "response.function_call_arguments.delta")
    assert arguments == whole.arguments
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == whole.arguments and done.item_id == added[0].id


def test_a_stream_names_each_event_and_sends_no_done_marker(server, model) -> None:
    body = {"model": model, "input": ASK, "max_output_tokens": 3, "temperature": 0,
            "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/responses", json=body,
                      headers=server.headers, timeout=TIMEOUT) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert len(lines) % 2 == 0
    for name, data in zip(lines[::2], lines[1::2]):
        assert name.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data.removeprefix("data: "))["type"] == name.removeprefix("event: ")
    assert "[DONE]" not in "".join(lines)


# -- cut responses -------------------------------------------------------------------------

def test_a_small_max_output_tokens_makes_the_response_incomplete(client, model) -> None:
    r = create(client, model, max_output_tokens=3)
    assert r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3
    assert [item.status for item in r.output] == ["incomplete"]


def test_a_cut_stream_ends_with_the_incomplete_response(client, model) -> None:
    last = list(create(client, model, max_output_tokens=3, stream=True))[-1]
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details.reason == "max_output_tokens"


# -- refusals ------------------------------------------------------------------------------

def test_previous_response_id_is_refused_and_the_server_goes_on(server, client, model) -> None:
    error = openai_error(post(server, {"previous_response_id": "resp_123"}), 400)
    assert error["message"] == (
        "previous_response_id is not supported: this server keeps no transcripts (message "
        "content is never stored); send the whole conversation in input.")
    assert error["param"] == "previous_response_id"
    assert create(client, model, max_output_tokens=2).output_text


@pytest.mark.parametrize("body, param", [
    ({"background": True}, "background"),
    ({"conversation": "conv_123"}, "conversation"),
    ({"truncation": "auto"}, "truncation"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
], ids=["background", "conversation", "truncation_auto", "logprobs"])
def test_what_needs_state_or_is_not_returned_is_refused(server, body: dict, param: str) -> None:
    error = openai_error(post(server, body), 400)
    assert error["param"] == param and error["message"].startswith(param)


def test_a_hosted_tool_is_left_out_and_the_request_served(server) -> None:
    """Clients send hosted tools as optional extras (Codex: web_search on every request)."""
    r = post(server, {"tools": [{"type": "web_search"}]})
    assert r.status_code == 200, r.text
    assert r.json()["tools"] == []
    assert "hosted tools left out (this server cannot run them): web_search" in server.output()


def test_an_unknown_tool_type_is_refused_by_name(server) -> None:
    error = openai_error(post(server, {"tools": [{"type": "wizardry", "name": "x"}]}), 400)
    assert "Tool type 'wizardry' (tools.0) is not supported" in error["message"]


def test_a_custom_tools_grammar_that_does_not_compile_is_refused_when_it_must_constrain(
        server) -> None:
    tool = {"type": "custom", "name": "patch",
            "format": {"type": "grammar", "syntax": "lark", "definition": "start: missing"}}
    error = openai_error(post(server, {"tools": [tool],
                                       "tool_choice": {"type": "custom", "name": "patch"}}), 400)
    assert "The Lark grammar does not compile" in error["message"]


def test_an_image_input_on_a_model_without_vision_is_refused_naming_it(server) -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    error = openai_error(post(server, {"input": [{"role": "user", "content": [image]}]}), 400)
    assert "has no vision" in error["message"] and error["param"] == "messages"


def test_an_input_image_by_file_id_is_refused_for_want_of_a_files_api(server) -> None:
    image = {"type": "input_image", "file_id": "file-123"}
    error = openai_error(post(server, {"input": [{"role": "user", "content": [image]}]}), 400)
    assert "file_id is not supported" in error["message"]


def test_an_unknown_content_part_is_refused_by_name(server) -> None:
    part = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    error = openai_error(post(server, {"input": [{"role": "user", "content": [part]}]}), 400)
    assert error["message"].startswith("Content part type 'input_audio' is not supported")


def test_max_output_tokens_out_of_range_is_refused_by_name(server) -> None:
    error = openai_error(post(server, {"max_output_tokens": 0}), 400)
    assert error["param"] == "max_output_tokens"
    assert error["message"] == "max_output_tokens must be at least 1, got 0."


def test_a_forced_call_with_a_text_format_is_refused(server) -> None:
    error = openai_error(post(server, {"tools": [ADD], "tool_choice": "required",
                                       "text": {"format": {"type": "json_object"}}}), 400)
    assert error["message"].startswith("A forced tool_choice and an output constraint")


# -- what Codex CLI sends --------------------------------------------------------------------

SPAWN = {"type": "function", "name": "spawn_agent", "description": "Start a sub-agent on a task",
         "parameters": {"type": "object", "properties": {"task": {"type": "string",
                                                                  "maxLength": 40}},
                        "required": ["task"], "additionalProperties": False}}
AGENTS = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents",
          "tools": [SPAWN]}


def codex_shaped(client: openai.OpenAI, model: str, **kw):
    """A request with Codex's shape: instructions, a developer message, a namespace tool and
    a hosted web_search tool, reasoning and include settings, store false."""
    kw.setdefault("input", [
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "Work in the current directory."}]},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Start a sub-agent to run the tests."}]}])
    return client.responses.create(
        model=model, instructions="You are a coding agent.", temperature=0,
        tools=[AGENTS, {"type": "web_search"}], tool_choice="required",
        parallel_tool_calls=False, reasoning={"summary": "auto"},
        include=["reasoning.encrypted_content"], store=False, max_output_tokens=60,
        extra_body={"prompt_cache_key": "conversation-1",
                    "client_metadata": {"originator": "codex_exec"}}, **kw)


def test_a_codex_shaped_call_names_the_function_and_its_namespace(client, model) -> None:
    (call,) = function_calls(codex_shaped(client, model))
    assert (call.name, call.namespace) == ("spawn_agent", "multi_agent_v1")
    assert set(json.loads(call.arguments)) == {"task"}


def test_a_codex_shaped_stream_parses_into_openais_events_and_ends_completed(client,
                                                                            model) -> None:
    events = list(codex_shaped(client, model, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert kinds.index("response.output_item.added") < kinds.index(
        "response.function_call_arguments.delta")
    (call,) = [item for item in events[-1].response.output if item.type == "function_call"]
    assert (call.name, call.namespace) == ("spawn_agent", "multi_agent_v1")
    assert events[-1].response.usage.output_tokens > 0


def test_a_codex_shaped_follow_up_with_its_call_output_and_reasoning_is_answered(
        client, model) -> None:
    r = client.responses.create(
        model=model, temperature=0, max_output_tokens=12, tools=[AGENTS, {"type": "web_search"}],
        tool_choice="none", store=False, input=[
            {"type": "message", "role": "user", "content": "Start a sub-agent."},
            {"type": "reasoning", "summary": [],
             "content": [{"type": "reasoning_text", "text": "One agent is enough."}]},
            {"type": "function_call", "call_id": "call_1", "name": "spawn_agent",
             "namespace": "multi_agent_v1", "arguments": '{"task": "tests"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "agent 7 started"}])
    assert r.status == "completed" or r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text


# -- custom (freeform) tools: Codex's apply_patch ---------------------------------------------

# A patch adding one line to one file: short enough for the 135M model to finish.
PATCH_LARK = 'start: "*** Begin Patch\\n+" LINE "\\n*** End Patch"\nLINE: /[a-z ]{1,12}/'
PATCH = re.compile(r"\*\*\* Begin Patch\n\+[a-z ]{1,12}\n\*\*\* End Patch")
APPLY_PATCH = {"type": "custom", "name": "apply_patch",
               "description": "Edit a file. This is a FREEFORM tool: send the patch itself.",
               "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_LARK}}
EDIT = "Add the line 'hello world' to a.txt."


def patch(client: openai.OpenAI, model: str, **kw):
    return client.responses.create(
        model=model, input=EDIT, temperature=0, tools=[ADD, APPLY_PATCH],
        tool_choice={"type": "custom", "name": "apply_patch"}, max_output_tokens=40, **kw)


def test_a_forced_custom_call_is_a_custom_tool_call_whose_input_is_in_its_grammar(
        client, model) -> None:
    response = patch(client, model)
    (item,) = response.output
    assert (item.type, item.name, response.status) == ("custom_tool_call", "apply_patch",
                                                       "completed")
    assert PATCH.fullmatch(item.input), item.input


def test_a_streamed_custom_call_sends_its_input_raw_and_ends_with_the_same_call(
        client, model) -> None:
    whole = patch(client, model).output[0]
    events = list(patch(client, model, stream=True))
    deltas = "".join(e.delta for e in events
                     if e.type == "response.custom_tool_call_input.delta")
    (done,) = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    (item,) = events[-1].response.output
    assert deltas == done.input == item.input == whole.input
    assert events[-1].type == "response.completed"


def test_a_follow_up_with_the_custom_call_and_its_output_is_answered(client, model) -> None:
    first = patch(client, model)
    (call,) = first.output
    history = [{"role": "user", "content": EDIT}, *[item.to_dict() for item in first.output],
               {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done."}]
    r = create(client, model, input=history, tools=[APPLY_PATCH], max_output_tokens=12)
    assert r.output_text or r.output


def test_custom_tools_offered_of_the_models_accord_are_served(server) -> None:
    """tool_choice auto: the tool is a function of one string for the model (the generic
    format, on the bundled model); its grammar describes the input, not constrains it."""
    r = post(server, {"input": EDIT, "tools": [APPLY_PATCH], "max_output_tokens": 24})
    assert r.status_code == 200, r.text
    assert r.json()["tools"][0]["format"]["definition"] == PATCH_LARK
