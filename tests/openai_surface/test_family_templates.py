"""Gemma 3's, Phi-4's and Phi-4-mini's chat templates (tests/support/chat_templates: stand-ins
with the real ones' behaviour) rendering what a request's plan gives them: none teaches a
tool format, so the tools are described in a system message, which Gemma 3 folds into the
first user turn; earlier calls and results reach each as text, since Gemma 3 refuses a tool
message and Phi-4 drops it."""

from __future__ import annotations

from pathlib import Path

import pytest

from officellm.app.chat.chat_formats import ChatFormats
from officellm.app.chat.tools import ChatTool, ToolRequest, template_message

TEMPLATES = Path(__file__).parents[1] / "support" / "chat_templates"
WEATHER = ChatTool.model_validate({"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
ASK = [{"role": "system", "content": "Answer in French."},
       {"role": "user", "content": "Weather in Paris?"}]
CALLED = [*ASK,
          template_message({"role": "assistant", "content": None, "tool_calls": [
              {"id": "call_1", "type": "function",
               "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}),
          {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'}]


def _render(tokenizer, family: str, messages: list[dict]) -> str:
    template = (TEMPLATES / f"{family}.jinja").read_text()
    plan = ChatFormats.resolve(template, "auto", "auto", True).plan(
        ToolRequest.of([WEATHER], "auto", True), None)
    return tokenizer.apply_chat_template(plan.messages(messages), chat_template=template,
                                         tokenize=False, add_generation_prompt=True,
                                         **plan.template_kwargs)


@pytest.mark.parametrize("family", ["gemma3", "phi4", "phi4_mini"])
def test_no_family_template_teaches_a_tool_format_so_the_generic_one_is_taught(family) -> None:
    formats = ChatFormats.resolve((TEMPLATES / f"{family}.jinja").read_text(), "auto", "auto",
                                  True)
    assert formats.tool_format is None and not formats.template_renders_tool_turns


def test_gemma3_has_the_system_text_and_the_tools_open_its_first_user_turn(
        smollm2_tokenizer) -> None:
    prompt = _render(smollm2_tokenizer, "gemma3", ASK)
    first_turn = prompt.split("<start_of_turn>user\n", 1)[1].split("<end_of_turn>")[0]
    assert first_turn.startswith("Answer in French.\n\nYou can call these functions")
    assert '"name": "get_weather"' in first_turn and "Weather in a city" in first_turn
    assert first_turn.endswith("Weather in Paris?")
    assert "<start_of_turn>system" not in prompt


def test_gemma3_renders_a_call_and_its_result_as_alternating_turns(smollm2_tokenizer) -> None:
    prompt = _render(smollm2_tokenizer, "gemma3", CALLED)
    assert ('<start_of_turn>model\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call><end_of_turn>\n<start_of_turn>user\n'
            '<tool_response>\n{"celsius": 21}\n</tool_response><end_of_turn>\n'
            "<start_of_turn>model\n") in prompt


def test_phi4_keeps_a_result_its_template_would_drop(smollm2_tokenizer) -> None:
    prompt = _render(smollm2_tokenizer, "phi4", CALLED)
    assert prompt.startswith("<|im_start|>system<|im_sep|>Answer in French.\n\nYou can call")
    assert ("<|im_start|>user<|im_sep|><tool_response>\n{\"celsius\": 21}\n</tool_response>"
            "<|im_end|><|im_start|>assistant<|im_sep|>") in prompt


def test_phi4_mini_gets_the_tools_in_its_system_turn_and_the_result_as_user_text(
        smollm2_tokenizer) -> None:
    prompt = _render(smollm2_tokenizer, "phi4_mini", CALLED)
    assert prompt.startswith("<|system|>Answer in French.\n\nYou can call these functions")
    assert "<|user|><tool_response>\n{\"celsius\": 21}\n</tool_response><|end|><|assistant|>" \
        in prompt


def test_results_and_a_user_message_after_them_are_one_user_turn(smollm2_tokenizer) -> None:
    messages = [*CALLED, {"role": "tool", "tool_call_id": "call_2", "content": "sunny"},
                {"role": "user", "content": "And tomorrow?"}]
    prompt = _render(smollm2_tokenizer, "gemma3", messages)
    assert ("<start_of_turn>user\n<tool_response>\n{\"celsius\": 21}\n</tool_response>\n"
            "<tool_response>\nsunny\n</tool_response>\nAnd tomorrow?<end_of_turn>\n") in prompt
