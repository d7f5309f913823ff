"""What Codex CLI sends the Responses API (its tools, roles and items), read into what the
chat pipeline runs (pure: no model): a namespace's functions are the model's
`namespace.name`, hosted tools are left out, calls of a namespace's function come back
named apart from it, as OpenAI's do, and custom (freeform) tools such as Codex's
apply_patch are functions of one string for the model and custom_tool_call items for the
client."""

from __future__ import annotations

import pytest
from openai.types.responses import Response
from pydantic import ValidationError

from officellm.app.chat.chat_output import ChatMessageParts
from officellm.app.chat.tool_parsers import ToolCall
from officellm.app.openai.responses_output import custom_input, output_items
from officellm.app.openai.responses_protocol import ResponsesRequest, ToolNames

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
    first, second = output_items(parts, False, codex_request().tool_names)
    assert (first.name, first.namespace) == ("spawn_agent", "multi_agent_v1")
    assert (second.name, "namespace" in second.model_dump()) == ("shell", False)


def test_a_dotted_name_outside_the_requests_namespaces_is_left_whole():
    names = ToolNames(namespaces=frozenset({"multi_agent_v1"}))
    assert names.split("other.tool") == ("other.tool", None)


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


# Codex's apply_patch, as it sends it to OpenAI's models that take freeform tools.
APPLY_PATCH_LARK = """start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?
hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change?
filename: /(.+)/
add_line: "+" /(.*)/ LF -> line
change: (change_context | change_line)+
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
%import common.LF
"""
APPLY_PATCH = {"type": "custom", "name": "apply_patch",
               "description": "Edit files with a patch. This is a FREEFORM tool.",
               "format": {"type": "grammar", "syntax": "lark", "definition": APPLY_PATCH_LARK}}
PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hi \"there\"\n*** End Patch\n"


def test_a_custom_tool_is_a_function_of_one_string_described_with_its_grammar():
    tool = codex_request(tools=[SHELL, APPLY_PATCH]).chat_tools()[1].function
    assert tool.name == "apply_patch"
    assert tool.parameters["required"] == ["input"]
    assert tool.parameters["properties"]["input"]["type"] == "string"
    assert "FREEFORM" in tool.description and "*** Begin Patch" in tool.description


def test_a_call_of_a_custom_tool_comes_back_as_a_custom_tool_call_with_its_raw_input():
    import json

    parts = ChatMessageParts(None, None, [
        ToolCall("call_1", "apply_patch", json.dumps({"input": PATCH}))])
    (item,) = output_items(parts, False, codex_request(tools=[APPLY_PATCH]).tool_names)
    assert (item.type, item.name, item.input) == ("custom_tool_call", "apply_patch", PATCH)
    from openai.types.responses import ResponseCustomToolCall
    ResponseCustomToolCall.model_validate(item.model_dump())


def test_a_custom_input_cut_short_is_what_of_it_was_written():
    assert custom_input('{"input": "*** Begin Patch\\n*** Add') == "*** Begin Patch\n*** Add"
    assert custom_input('{"input": "tab\\') == "tab"  # half an escape is none of it
    assert custom_input("not json at all") == "not json at all"


def test_an_earlier_custom_call_and_its_output_reach_the_template_as_a_call_and_a_result():
    request = codex_request(tools=[APPLY_PATCH], input=[
        {"type": "message", "role": "user", "content": "Add a.txt."},
        {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done."}])
    _, _, assistant, result = request.messages()
    assert assistant["tool_calls"][0]["function"] == {"name": "apply_patch",
                                                      "arguments": {"input": PATCH}}
    assert (result["role"], result["tool_call_id"], result["content"]) == ("tool", "call_1",
                                                                           "Done.")


def test_tool_choice_naming_a_custom_tool_makes_the_whole_answer_its_grammars_input():
    request = codex_request(tools=[SHELL, APPLY_PATCH],
                            tool_choice={"type": "custom", "name": "apply_patch"})
    freeform = request.tool_request().freeform
    assert freeform.name == "apply_patch"
    assert freeform.grammar.lark == APPLY_PATCH_LARK
    assert "apply_patch" in freeform.system_text


def test_a_regex_custom_tool_is_constrained_by_its_regex_and_a_text_one_by_nothing():
    def forced(fmt):
        tool = {"type": "custom", "name": "code", "format": fmt}
        return codex_request(tools=[tool], tool_choice={"type": "custom", "name": "code"}
                             ).tool_request().freeform.grammar
    assert forced({"type": "grammar", "syntax": "regex", "definition": "[A-Z]{3}"}).regex == \
        "[A-Z]{3}"
    assert forced({"type": "text"}) is None


@pytest.mark.parametrize(("tool", "choice", "message"), [
    ({"type": "custom", "name": "x", "format": {"type": "grammar", "syntax": "lark"}}, "auto",
     "needs its syntax"),
    ({"type": "custom", "name": "x", "format": {"type": "grammar", "syntax": "peg",
                                                 "definition": "a"}}, "auto", "syntax"),
])
def test_a_custom_tool_with_an_incomplete_or_unknown_grammar_is_refused(tool, choice, message):
    with pytest.raises(ValidationError, match=message):
        codex_request(tools=[tool], tool_choice=choice)


def test_tool_choice_naming_a_custom_tool_that_is_not_given_is_refused():
    with pytest.raises(ValueError, match="custom tool 'apply_patch', which is not in tools"):
        codex_request(tools=[SHELL], tool_choice={"type": "custom", "name": "apply_patch"}
                      ).tool_request()


def test_the_echoed_custom_tool_and_choice_validate_as_the_openai_packages_types():
    from officellm.app.openai.routes.responses import _in_progress

    request = codex_request(tools=[APPLY_PATCH, {**AGENTS, "tools": [SPAWN, APPLY_PATCH]}],
                            tool_choice={"type": "custom", "name": "apply_patch"})
    response = _in_progress("resp_1", 0, request, request.sampling_params(), "m")
    echoed = Response.model_validate({**response.model_dump(), "output": []})
    assert echoed.tools[0].format.definition == APPLY_PATCH_LARK
    assert echoed.tool_choice.type == "custom"


def test_tool_search_is_left_out_and_deferred_tools_are_shown_from_the_start():
    """Codex sends tool_search (run by the client) with OpenAI's newest models; it finds the
    tools marked defer_loading, which here the model sees from the start."""
    search = {"type": "tool_search", "execution": "client", "description": "Find tools",
              "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}
    deferred = {**SHELL, "name": "mcp_lookup", "defer_loading": True}
    request = codex_request(tools=[SHELL, deferred, APPLY_PATCH, search, WEB])
    assert request.skipped_tools == ["tool_search", "web_search"]
    assert [t.function.name for t in request.chat_tools()] == ["shell", "mcp_lookup",
                                                               "apply_patch"]
