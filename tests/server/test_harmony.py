"""gpt-oss's harmony turns through the real server and the real `openai` and `anthropic`
clients: reasoning and a tool call, reasoning and an answer, as Chat Completions'
reasoning_content and tool_calls (whole and streamed), the Responses API's output items and
Anthropic's thinking and tool_use blocks.

The engine really generates the harmony text. The model is tests/support/harmony_model.py's:
the bundled SmolLM2 tokenizer with harmony's special tokens added and a harmony chat template
(so the server picks the harmony parsers by itself, with no flag), and a one-layer Llama
whose weights are solved so that greedy decoding answers these prompts with these turns,
token by token, `<|channel|>` and the rest as single special tokens. The server must keep
them in the decoded text for its readers and keep every one of them from the clients. One
turn depends on the reasoning effort, so it also shows each API's effort reaching the
template. A forced call runs the same model under the harmony call grammar.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from tests.support.harmony_model import HarmonyTurn, build_harmony_model
from tests.support.server_api import TIMEOUT
from tests.support.server_process import ServerProcess

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather",
                                           "description": "Weather in a city",
                                           "parameters": WEATHER}}]
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
ASK_SUM = [{"role": "user", "content": "What is 2 + 2?"}]

CALL_REASONING = "The user wants the weather in Paris. Call get_weather."
ARGUMENTS = {"city": "Paris", "unit": "celsius"}
CALL_TURN = (f"<|channel|>analysis<|message|>{CALL_REASONING}<|end|><|start|>assistant"
             "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
             '{"city": "Paris", "unit": "celsius"}<|call|>')
SUM_REASONING = "Simple arithmetic: 2 + 2 = 4."
HIGH_REASONING = "Reasoning high: check twice. 2 + 2 = 4, and 4 - 2 = 2."
ANSWER = "2 + 2 = 4."


def _answer_turn(reasoning: str) -> str:
    return (f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant<|channel|>"
            f"final<|message|>{ANSWER}<|return|>")


# Medium: the template's default (Chat Completions and the Responses API without an effort);
# low: Anthropic's without thinking or with a small budget; high: asked for.
TURNS = [turn for effort in ("medium", "low") for turn in (
    HarmonyTurn(ASK_WEATHER, CALL_TURN, TOOLS, {"reasoning_effort": effort}),
    HarmonyTurn(ASK_SUM, _answer_turn(SUM_REASONING), None, {"reasoning_effort": effort}))
] + [HarmonyTurn(ASK_SUM, _answer_turn(HIGH_REASONING), None, {"reasoning_effort": "high"})]


@pytest.fixture(scope="module")
def gpt_oss_server(tmp_path_factory, smollm2_dir: Path) -> Iterator[ServerProcess]:
    model_dir = build_harmony_model(tmp_path_factory.mktemp("gpt-oss-tiny"), smollm2_dir,
                                    TURNS)
    srv = ServerProcess(str(model_dir), "--served-model-name", "gpt-oss-tiny")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def gpt(gpt_oss_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gpt_oss_server.base_url}/v1",
                         api_key=gpt_oss_server.api_key, timeout=TIMEOUT, max_retries=0)


@pytest.fixture(scope="module")
def claude(gpt_oss_server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gpt_oss_server.base_url,
                               api_key=gpt_oss_server.api_key, timeout=TIMEOUT, max_retries=0)


def _chat(gpt: openai.OpenAI, messages: list, **kw):
    return gpt.chat.completions.create(model="gpt-oss-tiny", messages=messages, temperature=0,
                                       max_tokens=80, **kw)


@pytest.fixture(scope="module")
def called(gpt):
    return _chat(gpt, ASK_WEATHER, tools=TOOLS).choices[0]


def test_reasoning_then_a_call_is_reasoning_content_and_a_tool_call(called) -> None:
    message = called.message
    assert called.finish_reason == "tool_calls"
    assert (message.reasoning_content, message.content) == (CALL_REASONING, None)
    (call,) = message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == ARGUMENTS


def test_a_streamed_call_assembles_to_the_whole_one_with_no_marker_on_the_wire(
        gpt, called) -> None:
    reasoning, content, name, arguments, finish = "", "", None, "", None
    for chunk in _chat(gpt, ASK_WEATHER, tools=TOOLS, stream=True):
        for choice in chunk.choices:
            delta = choice.delta
            assert "<|" not in chunk.model_dump_json(), chunk
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
            for piece in delta.tool_calls or []:
                name = piece.function.name or name
                arguments += piece.function.arguments or ""
            finish = choice.finish_reason or finish
    assert (reasoning, content, finish) == (CALL_REASONING, "", "tool_calls")
    assert (name, arguments) == (called.message.tool_calls[0].function.name,
                                 called.message.tool_calls[0].function.arguments)


def test_reasoning_then_an_answer_is_reasoning_content_and_content(gpt) -> None:
    choice = _chat(gpt, ASK_SUM).choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert (choice.message.reasoning_content, choice.message.content) == (SUM_REASONING, ANSWER)


def test_reasoning_effort_reaches_the_template(gpt) -> None:
    message = _chat(gpt, ASK_SUM, reasoning_effort="high").choices[0].message
    assert (message.reasoning_content, message.content) == (HIGH_REASONING, ANSWER)


def test_a_named_call_is_forced_in_harmonys_own_shape(gpt) -> None:
    choice = _chat(gpt, ASK_WEATHER, tools=TOOLS, tool_choice={
        "type": "function", "function": {"name": "get_weather"}}).choices[0]
    assert choice.message.reasoning_content == CALL_REASONING
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in choice.message.tool_calls] == [("get_weather", ARGUMENTS)]


RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
                    "parameters": WEATHER}]


def test_responses_reasoning_and_a_call_are_a_reasoning_item_and_a_function_call(gpt) -> None:
    response = gpt.responses.create(model="gpt-oss-tiny", input=ASK_WEATHER[0]["content"],
                                    tools=RESPONSES_TOOLS, temperature=0, max_output_tokens=80)
    reasoning, call = response.output
    assert (reasoning.type, [part.text for part in reasoning.content]) == (
        "reasoning", [CALL_REASONING])
    assert (call.type, call.name, json.loads(call.arguments)) == (
        "function_call", "get_weather", ARGUMENTS)


def test_responses_streamed_reasoning_and_answer_complete_as_items(gpt) -> None:
    events = list(gpt.responses.create(model="gpt-oss-tiny", input=ASK_SUM[0]["content"],
                                       temperature=0, max_output_tokens=80,
                                       reasoning={"effort": "high"}, stream=True))
    (done,) = [e for e in events if e.type == "response.completed"]
    reasoning, message = done.response.output
    assert [part.text for part in reasoning.content] == [HIGH_REASONING]
    assert message.type == "message" and done.response.output_text == ANSWER
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == \
        HIGH_REASONING


ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Weather in a city",
                    "input_schema": WEATHER}]
THINKING = {"type": "enabled", "budget_tokens": 1024}  # low effort


def _claude(claude: anthropic.Anthropic, messages: list, **kw):
    return claude.messages.create(model="gpt-oss-tiny", max_tokens=80, messages=messages,
                                  extra_body={"temperature": 0}, thinking=THINKING, **kw)


def test_anthropic_reasoning_and_a_call_are_thinking_and_tool_use_blocks(claude) -> None:
    message = _claude(claude, ASK_WEATHER, tools=ANTHROPIC_TOOLS)
    thinking, tool_use = message.content
    assert (thinking.type, thinking.thinking) == ("thinking", CALL_REASONING)
    assert (tool_use.type, tool_use.name, tool_use.input) == ("tool_use", "get_weather",
                                                               ARGUMENTS)
    assert message.stop_reason == "tool_use"


def test_anthropic_streamed_reasoning_and_answer_are_thinking_and_text_blocks(claude) -> None:
    with claude.messages.stream(model="gpt-oss-tiny", max_tokens=80, messages=ASK_SUM,
                                extra_body={"temperature": 0}, thinking=THINKING) as stream:
        message = stream.get_final_message()
    thinking, text = message.content
    assert (thinking.type, thinking.thinking) == ("thinking", SUM_REASONING)
    assert (text.type, text.text, message.stop_reason) == ("text", ANSWER, "end_turn")
