"""How a chat request's tools, tool_choice and output constraint become its plan (pure: no
model): which grammar, what the template is given, how the text is read."""

from __future__ import annotations

import json

import pytest

from officellm.app.chat.chat_formats import ChatFormats
from officellm.app.chat.output_constraint import Constraint
from officellm.app.chat.reasoning_parsers import REASONING_PARSERS
from officellm.app.chat.tools import (
    ChatTool,
    FreeformCall,
    NamedToolChoice,
    ToolRequest,
    template_message,
)
from officellm.engine import SamplingParams
from officellm.engine.structured_output import StructuredOutputsParams

WEATHER = ChatTool.model_validate({"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}})
HERMES_TEMPLATE = "{% if tools %}<tools>{{ tools }}</tools> reply in <tool_call></tool_call>{% endif %}"
PLAIN_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


def formats(template: str, parser: str = "auto", reasoning: str = "auto",
            auto_choice: bool = True) -> ChatFormats:
    return ChatFormats.resolve(template, parser, reasoning, auto_choice)


def tools(choice="auto", parallel=True) -> ToolRequest:
    request = ToolRequest.of([WEATHER], choice, parallel)
    assert request is not None
    return request


def test_auto_detects_hermes_from_a_template_that_teaches_tool_call_tags():
    assert formats(HERMES_TEMPLATE).tool_format == "hermes"


def test_auto_finds_no_format_in_a_template_without_tools():
    assert formats(PLAIN_TEMPLATE).tool_format is None


def test_auto_reasoning_is_qwen3_for_a_template_that_writes_think():
    assert formats(PLAIN_TEMPLATE + "<think>").reasoning is not None
    assert formats(PLAIN_TEMPLATE).reasoning is None


def test_tools_reach_a_template_that_renders_them():
    plan = formats(HERMES_TEMPLATE).plan(tools(), None)
    assert plan.template_kwargs["tools"][0]["function"]["name"] == "get_weather"
    assert plan.system_text is None and plan.constraint is None and plan.kind == "tool_auto"


def test_a_template_that_ignores_tools_gets_them_in_a_system_message():
    plan = formats(PLAIN_TEMPLATE).plan(tools("required"), None)
    messages = plan.messages([{"role": "user", "content": "hi"}])
    assert messages[0]["role"] == "system" and "get_weather" in messages[0]["content"]
    assert plan.template_kwargs == {}


def test_the_tools_text_joins_an_existing_system_message():
    plan = formats(PLAIN_TEMPLATE).plan(tools("required"), None)
    messages = plan.messages([{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "hi"}])
    assert len(messages) == 2 and messages[0]["content"].startswith("Be brief.\n\n")


def test_auto_on_a_model_without_a_format_teaches_the_generic_one():
    plan = formats(PLAIN_TEMPLATE).plan(tools(), None)
    assert plan.constraint is None and plan.kind == "tool_auto" and plan.template_kwargs == {}
    assert "get_weather" in plan.system_text
    assert 'reply with <tool_call>\n{"name": "NAME", "arguments": ARGUMENTS}\n</tool_call>' \
        in plan.system_text


def test_the_generic_format_reads_a_reply_that_calls_and_one_that_does_not():
    reader = formats(PLAIN_TEMPLATE).plan(tools(), None).reader
    called = reader.message('<tool_call>\n{"name": "get_weather", "arguments": '
                            '{"city": "Paris"}}\n</tool_call>')
    assert [(c.name, c.arguments) for c in called.tool_calls] == [
        ("get_weather", '{"city": "Paris"}')]
    answered = reader.message("It is sunny in Paris.")
    assert answered.content == "It is sunny in Paris." and answered.tool_calls == []


def test_a_template_that_renders_tools_in_no_known_format_gets_the_generic_one():
    plan = formats("{% if tools %}{{ tools }}{% endif %}").plan(tools(), None)
    assert plan.template_kwargs == {} and "ARGUMENTS" in plan.system_text


def test_auto_is_refused_when_tool_calling_is_off():
    with pytest.raises(ValueError, match="--tool-call-parser none"):
        formats(PLAIN_TEMPLATE, parser="none").plan(tools(), None)


def test_auto_is_refused_when_the_server_turned_it_off():
    with pytest.raises(ValueError, match="--no-enable-auto-tool-choice"):
        formats(HERMES_TEMPLATE, auto_choice=False).plan(tools(), None)


def test_a_forced_call_and_an_output_constraint_are_refused_together():
    constraint = Constraint.of(StructuredOutputsParams(json_object=True))
    with pytest.raises(ValueError, match="cannot both apply"):
        formats(HERMES_TEMPLATE).plan(tools("required"), constraint)


def test_a_required_call_is_a_structural_tag_over_every_tool():
    plan = formats(PLAIN_TEMPLATE).plan(tools("required", parallel=False), None)
    assert plan.kind == "tool_required"
    tag = json.loads(plan.constraint.spec.structural_tag)["format"]
    assert tag["type"] == "tags_with_separator" and tag["at_least_one"]
    assert tag["stop_after_first"]  # parallel_tool_calls false: one call
    assert tag["tags"][0]["begin"].startswith('<tool_call>\n{"name": "get_weather"')


def test_a_named_call_is_that_functions_tag_in_the_llama_format():
    named = NamedToolChoice.model_validate({"type": "function",
                                            "function": {"name": "get_weather"}})
    plan = formats(PLAIN_TEMPLATE, parser="llama3_json").plan(tools(named), None)
    tag = json.loads(plan.constraint.spec.structural_tag)["format"]
    assert plan.kind == "tool_named"
    assert tag == {"type": "tag", "begin": '{"name": "get_weather", "parameters": ',
                   "content": {"type": "json_schema",
                               "json_schema": WEATHER.function.parameters},
                   "end": "}"}


def test_a_choice_naming_an_absent_tool_is_refused():
    named = NamedToolChoice.model_validate({"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ValueError, match="'nope', which is not in tools"):
        ToolRequest.of([WEATHER], named, True)


def test_tool_choice_none_means_no_tools_in_play():
    assert ToolRequest.of([WEATHER], "none", True) is None


def test_history_arguments_reach_the_template_as_objects():
    message = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    assert template_message(message)["tool_calls"][0]["function"]["arguments"] == {
        "city": "Paris"}


def test_history_arguments_that_are_not_json_are_refused():
    message = {"role": "assistant", "tool_calls": [
        {"id": "call_1", "function": {"name": "f", "arguments": "{oops"}}]}
    with pytest.raises(ValueError, match="call_1"):
        template_message(message)


# gpt-oss's template, the lines that matter here: it writes harmony's markers and the tools.
GPT_OSS_TEMPLATE = ("{%- if tools %}{{- render_tool_namespace('functions', tools) }}{%- endif %}"
                    "{{- '<|start|>assistant<|channel|>final<|message|>' + m.content }}")
SAMPLING = SamplingParams(max_tokens=8)


def test_auto_reads_gpt_oss_in_harmony_both_ways():
    chosen = formats(GPT_OSS_TEMPLATE)
    assert chosen.harmony and chosen.tool_format == "harmony"
    assert chosen.reasoning is REASONING_PARSERS["harmony"]


@pytest.mark.parametrize("flag", ["parser", "reasoning"])
def test_either_flag_naming_harmony_makes_the_model_a_harmony_one(flag):
    chosen = formats(PLAIN_TEMPLATE, **{flag: "harmony"})
    assert chosen.harmony and chosen.tool_format == "harmony"
    assert chosen.reasoning is REASONING_PARSERS["harmony"]


def test_another_familys_parser_on_a_harmony_model_is_refused_at_load():
    with pytest.raises(ValueError, match="--tool-call-parser hermes cannot read"):
        formats(GPT_OSS_TEMPLATE, parser="hermes")


def test_a_harmony_plan_keeps_special_tokens_with_tools_or_without():
    chosen = formats(GPT_OSS_TEMPLATE)
    for plan in (chosen.plan(None, None), chosen.plan(tools(), None)):
        assert plan.keep_special_tokens
        assert plan.sampling_params(SAMPLING).skip_special_tokens is False


def test_other_plans_leave_special_tokens_skipped():
    plan = formats(HERMES_TEMPLATE).plan(tools(), None)
    assert not plan.keep_special_tokens and plan.sampling_params(SAMPLING) is SAMPLING


def test_a_harmony_reply_without_tools_still_loses_its_markers():
    reader = formats(GPT_OSS_TEMPLATE).plan(None, None).reader
    parts = reader.message("<|channel|>analysis<|message|>Hi back.<|end|><|start|>assistant"
                           "<|channel|>final<|message|>Hello!<|return|>")
    assert (parts.reasoning, parts.content) == ("Hi back.", "Hello!")


def test_tools_reach_gpt_oss_template_and_its_calls_are_read():
    plan = formats(GPT_OSS_TEMPLATE).plan(tools(), None)
    assert plan.template_kwargs["tools"][0]["function"]["name"] == "get_weather"
    assert plan.system_text is None
    parts = plan.reader.message("<|channel|>commentary to=functions.get_weather <|constrain|>"
                                'json<|message|>{"city": "Paris"}<|call|>')
    assert [(c.name, c.arguments) for c in parts.tool_calls] == [
        ("get_weather", '{"city": "Paris"}')]


def test_a_forced_harmony_call_is_an_optional_analysis_then_the_call_in_harmony():
    named = NamedToolChoice.model_validate({"type": "function",
                                            "function": {"name": "get_weather"}})
    plan = formats(GPT_OSS_TEMPLATE).plan(tools(named), None)
    tag = json.loads(plan.constraint.spec.structural_tag)["format"]
    analysis, call = tag["elements"]
    assert analysis["type"] == "optional"
    assert analysis["content"]["begin"] == "<|channel|>analysis<|message|>"
    assert analysis["content"]["end"] == "<|end|><|start|>assistant"
    assert call == {"type": "tag", "begin": "<|channel|>commentary to=functions.get_weather "
                                            "<|constrain|>json<|message|>",
                    "content": {"type": "json_schema",
                                "json_schema": WEATHER.function.parameters},
                    "end": ""}


def test_a_required_harmony_call_is_one_call_of_any_tool():
    other = ChatTool.model_validate({"type": "function", "function": {"name": "add"}})
    request = ToolRequest.of([WEATHER, other], "required", True)
    tag = json.loads(formats(GPT_OSS_TEMPLATE).plan(request, None)
                     .constraint.spec.structural_tag)["format"]
    calls = tag["elements"][1]
    assert calls["type"] == "or"
    assert [c["begin"].split()[1] for c in calls["elements"]] == [
        "to=functions.get_weather", "to=functions.add"]


def test_a_forced_custom_tool_with_a_grammar_is_refused_on_a_harmony_model():
    freeform = FreeformCall("patch", "Answer with the patch.",
                            StructuredOutputsParams(regex="[a-z]+"))
    request = ToolRequest([WEATHER], "named", "patch", True, freeform=freeform)
    with pytest.raises(ValueError, match="'patch' has a grammar"):
        formats(GPT_OSS_TEMPLATE).plan(request, None)


def test_a_harmony_plan_gives_the_template_earlier_reasoning_as_thinking():
    plan = formats(GPT_OSS_TEMPLATE).plan(None, None)
    messages = plan.messages([{"role": "user", "content": "hi"},
                              {"role": "assistant", "content": "Hello!",
                               "reasoning_content": "Greet back."}])
    assert messages[1]["thinking"] == "Greet back."
