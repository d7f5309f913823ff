"""What Codex CLI sends the Responses API (its tools, roles and items), read into what the
chat pipeline runs (pure: no model): a namespace's functions are the model's
`namespace.name`, hosted tools are left out, and calls of a namespace's function come back
named apart from it, as OpenAI's do."""

from __future__ import annotations

import pytest
from openai.types.responses import Response
from pydantic import ValidationError

from officellm.app.chat.chat_output import ChatMessageParts
from officellm.app.chat.tool_parsers import ToolCall
from officellm.app.openai.responses_output import output_items, split_call_name
from officellm.app.openai.responses_protocol import ResponsesRequest

SHELL = {"type": "function", "name": "shell", "description": "Run a command",
         "parameters": {"type": "object", "properties": {"command": {"type": "array",
                                                                     "items": {"type": "string"}}},
                        "required": ["command"]}}
SPAWN = {"type": "function", "name": "spawn_agent", "description": "Start a sub-agent",
         "parameters": {"type": "object", "properties": {"task": {"type": "string"}},
                        "required": ["task"]}}
AGENTS = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents",
          "tools": [SPAWN]}
WEB = {"type": "web_search", "external_web_access": False}


def codex_request(**extra) -> ResponsesRequest:
    body = {"model": "m", "instructions": "You are Codex.", "store": False, "stream": True,
            "tools": [SHELL, AGENTS, WEB], "tool_choice": "auto",
            "parallel_tool_calls": False, "reasoning": {"summary": "auto"},
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "conv-1",
            "client_metadata": {"originator": "codex_exec"},
            "input": [{"type": "message", "role": "developer",
                       "content": [{"type": "input_text", "text": "Sandbox: read-only."}]},
                      {"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": "List the files."}]}],
            **extra}
    return ResponsesRequest.model_validate(body)


def test_a_namespaces_functions_are_named_namespace_dot_name_for_the_model():
    names = [t.function.name for t in codex_request().chat_tools()]
    assert names == ["shell", "multi_agent_v1.spawn_agent"]


def test_hosted_tools_are_left_out_and_named():
    request = codex_request()
    assert request.skipped_tools == ["web_search"]
    assert [t.type for t in request.tools] == ["function", "namespace"]


def test_a_tool_type_that_is_neither_hosted_nor_a_function_is_refused_naming_it():
    with pytest.raises(ValidationError, match="'wizardry' .tools.3. is not supported"):
        codex_request(tools=[SHELL, AGENTS, WEB, {"type": "wizardry", "name": "x"}])


def test_a_call_of_a_namespaces_function_comes_back_named_apart_from_it():
    parts = ChatMessageParts(None, None, [
        ToolCall("call_1", "multi_agent_v1.spawn_agent", '{"task": "tests"}'),
        ToolCall("call_2", "shell", '{"command": ["ls"]}')])
    first, second = output_items(parts, False, codex_request().namespaces)
    assert (first.name, first.namespace) == ("spawn_agent", "multi_agent_v1")
    assert (second.name, "namespace" in second.model_dump()) == ("shell", False)


def test_a_dotted_name_outside_the_requests_namespaces_is_left_whole():
    assert split_call_name("other.tool", frozenset({"multi_agent_v1"})) == ("other.tool", None)


def test_an_earlier_namespaced_call_reaches_the_template_by_the_name_the_model_used():
    request = codex_request(input=[
        {"type": "message", "role": "user", "content": "Spawn one."},
        {"type": "function_call", "call_id": "call_1", "name": "spawn_agent",
         "namespace": "multi_agent_v1", "arguments": '{"task": "tests"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "started"}])
    assistant = request.messages()[2]
    assert assistant["tool_calls"][0]["function"]["name"] == "multi_agent_v1.spawn_agent"


def test_developer_messages_and_codexs_hints_are_read():
    messages = codex_request().messages()
    assert [m["role"] for m in messages] == ["system", "developer", "user"]
    codex_request().check_supported()  # include, store false, prompt_cache_key: all accepted


def test_the_echoed_namespace_tool_validates_as_the_openai_packages_type():
    from officellm.app.openai.routes.responses import _in_progress

    request = codex_request()
    response = _in_progress("resp_1", 0, request, request.sampling_params(), "m")
    Response.model_validate({**response.model_dump(), "output": []})
