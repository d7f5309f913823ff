"""Choosing a tool call parser by name, or from the model's chat template with "auto"."""

from __future__ import annotations

import pytest

from officellm.app.chat.tool_parsers import TOOL_CALL_PARSERS, parser_for

# Excerpts of the real chat templates: the lines that teach the model its call format.
QWEN25_TEMPLATE = (
    '{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name '
    'and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": '
    '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}')
LLAMA31_TEMPLATE = (
    "{{- \"Given the following functions, please respond with a JSON for a function call with "
    "its proper arguments that best answers the given prompt.\\n\\n\" }}\n"
    "{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of "
    "argument name and its value}.' }}\n"
    "{{- '<|python_tag|>' + tool_call.name + '.call(' }}")
LLAMA_INSTRUCTION_ONLY = (
    "{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of "
    "argument name and its value}.' }}")
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.mark.parametrize("name", ["hermes", "llama3_json"])
def test_a_parser_named_is_that_parser_whatever_the_template(name: str) -> None:
    assert parser_for(name, SMOLLM2_TEMPLATE) is TOOL_CALL_PARSERS[name]


def test_none_means_no_parser() -> None:
    assert parser_for("none", QWEN25_TEMPLATE) is None


@pytest.mark.parametrize(("template", "expected"), [
    (QWEN25_TEMPLATE, "hermes"),
    (LLAMA31_TEMPLATE, "llama3_json"),
    (LLAMA_INSTRUCTION_ONLY, "llama3_json"),
    ("{{ '<|python_tag|>' }}", "llama3_json"),
], ids=["qwen2.5", "llama3.1", "llama instruction only", "python tag only"])
def test_auto_detects_the_format_the_template_teaches(template: str, expected: str) -> None:
    assert parser_for("auto", template) is TOOL_CALL_PARSERS[expected]


@pytest.mark.parametrize("template", [SMOLLM2_TEMPLATE, "", None])
def test_auto_gives_no_parser_for_a_template_without_a_known_format(template) -> None:
    assert parser_for("auto", template) is None


def test_an_unknown_name_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="'mistral'.*auto, none, hermes, llama3_json"):
        parser_for("mistral", None)
