"""Llama 3.1/3.2 JSON tool calls: [<|python_tag|>]{"name", "parameters"}; {...}."""

from __future__ import annotations

import pytest

from officellm.app.chat.tool_parsers import ParsedToolOutput
from officellm.app.chat.tool_parsers.llama3_json import Llama3JsonToolParser

PARSER = Llama3JsonToolParser()
CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'


@pytest.mark.parametrize("text", [CALL, f"<|python_tag|>{CALL}", f"\n {CALL}",
                                  f"\n<|python_tag|> {CALL}"])
def test_an_output_opening_with_a_call_or_the_python_tag_is_calls(text: str) -> None:
    parsed = PARSER.parse(text)
    assert parsed.content is None
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("get_weather", '{"city": "Paris"}')]


def test_the_arguments_key_is_accepted_for_parameters() -> None:
    (call,) = PARSER.parse('{"name": "f", "arguments": {"x": 1}}').tool_calls
    assert call.arguments == '{"x": 1}'


@pytest.mark.parametrize("separator", [";", "; ", "\n", ";\n", "  "])
def test_calls_are_separated_by_semicolons_or_whitespace(separator: str) -> None:
    assert len(PARSER.parse(f"{CALL}{separator}{CALL}{separator}").tool_calls) == 2


@pytest.mark.parametrize("text", [
    "Paris is sunny today.",
    f"Calling: {CALL}",  # calls must open the output
    '{"city": "Paris"}',
    '{"name": "Paris", "population": 2100000}',
    '<|python_tag|>brave_search.call(query="Paris")',
])
def test_an_output_whose_first_call_has_no_header_is_content_verbatim(text: str) -> None:
    assert PARSER.parse(text) == ParsedToolOutput(text, [])


def test_text_after_the_calls_is_content() -> None:
    parsed = PARSER.parse(f"{CALL};\nLet me know if you need more.")
    assert parsed.content == "Let me know if you need more."
    assert len(parsed.tool_calls) == 1


def test_keys_after_the_arguments_are_not_read() -> None:
    parsed = PARSER.parse('{"name": "f", "parameters": {"a": "}"}, "note": "{x}"}; ' + CALL)
    assert [c.arguments for c in parsed.tool_calls] == ['{"a": "}"}', '{"city": "Paris"}']


def test_nothing_is_streamed_while_the_output_may_still_open_with_the_tag() -> None:
    stream = PARSER.stream()
    assert stream.feed("\n<|python").content == ""
    assert stream.feed("_tag|>").content == ""
    assert stream.feed('{"name": "f", "parameters": {').tool_calls[0].name == "f"


def test_plain_content_streams_once_it_cannot_be_a_call() -> None:
    stream = PARSER.stream()
    assert stream.feed("<|py").content == ""
    assert stream.feed("thon is great").content == "<|python is great"
    assert stream.feed(" {").content == " {"


def test_a_rejected_first_call_streams_the_whole_output_as_content() -> None:
    stream = PARSER.stream()
    assert stream.feed('<|python_tag|>{"name": "f"').content == ""
    assert stream.feed("}").content == '<|python_tag|>{"name": "f"}'


def test_arguments_stream_in_pieces_and_the_next_call_follows() -> None:
    stream = PARSER.stream()
    first = stream.feed('{"name": "f", "parameters": {"q": "a').tool_calls
    more = stream.feed('b"}}; {"name": "g", "parameters": {}}').tool_calls
    assert [(p.index, p.name, p.arguments) for p in first + more] == [
        (0, "f", '{"q": "a'), (0, None, 'b"}'), (1, "g", "{}")]
