"""Hermes tool calls (Qwen2.5, Qwen3, Hermes): <tool_call>{"name", "arguments"}</tool_call>."""

from __future__ import annotations

import json
import re

import pytest

from officellm.app.chat.tool_parsers import ParsedToolOutput, StreamDelta
from officellm.app.chat.tool_parsers.hermes import HermesToolParser
from tests.openai_parsers.streams import assemble_tool_deltas, tool_deltas

PARSER = HermesToolParser()
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_arguments_are_the_models_text_of_the_arguments_object() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {"b": 1.0,  "a": "\\u00e9"}}\n</tool_call>'
    assert PARSER.parse(text).tool_calls[0].arguments == '{"b": 1.0,  "a": "\\u00e9"}'


def test_text_around_and_between_blocks_is_content_verbatim() -> None:
    parsed = PARSER.parse(f"Checking.\n{CALL}\n{CALL}\nDone.")
    assert parsed.content == "Checking.\n\n\nDone."
    assert len(parsed.tool_calls) == 2


@pytest.mark.parametrize("blank", ["", " ", "\n\n", "\n \t"])
def test_content_that_is_only_whitespace_is_none(blank: str) -> None:
    assert PARSER.parse(f"{blank}{CALL}{blank}").content is None


@pytest.mark.parametrize("body", [
    "{'name': 'get_weather', 'arguments': {'city': 'Paris'}}",  # a Python dict
    '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}',  # arguments as a string
    '{"arguments": {"city": "Paris"}, "name": "get_weather"}',  # arguments first
    '{"name": "", "arguments": {}}',
    '{"name": "get_weather"}',
    "get_weather(city='Paris')",
])
def test_a_block_without_a_call_header_is_content_tags_and_all(body: str) -> None:
    text = f"<tool_call>\n{body}\n</tool_call>"
    assert PARSER.parse(text) == ParsedToolOutput(text, [])


def test_a_call_cut_short_keeps_the_arguments_written_so_far() -> None:
    (call,) = PARSER.parse('<tool_call>\n{"name": "f", "arguments": {"q": "ab').tool_calls
    assert (call.name, call.arguments) == ("f", '{"q": "ab')


def test_malformed_arguments_after_a_good_header_are_passed_on_as_written() -> None:
    # The name may already be streamed by then: the call cannot turn back into content.
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1,}}\n</tool_call>'
    assert PARSER.parse(text).tool_calls[0].arguments == '{"a": 1,}'


def test_what_follows_the_arguments_inside_the_call_object_is_not_read() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1}, "id": 7} trailing\n</tool_call>'
    parsed = PARSER.parse(text)
    assert parsed.content is None and parsed.tool_calls[0].arguments == '{"a": 1}'


def test_a_block_ends_at_the_first_closing_tag_even_inside_a_json_string() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {"code": "x</tool_call>"}}\n</tool_call>'
    parsed = PARSER.parse(text)
    assert parsed.tool_calls[0].arguments == '{"code": "x'
    assert parsed.content == '"}}\n</tool_call>'


def test_each_call_gets_an_openai_style_id_of_its_own() -> None:
    calls = PARSER.parse(CALL + CALL).tool_calls
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", call.id) for call in calls)
    assert calls[0].id != calls[1].id


def test_content_streams_as_it_arrives() -> None:
    stream = PARSER.stream()
    assert stream.feed("The weather").content == "The weather"
    assert stream.feed(" is").content == " is"


@pytest.mark.parametrize("partial", ["<", "<tool", "<tool_call"])
def test_a_suffix_that_may_start_the_tag_is_held_until_it_is_clear(partial: str) -> None:
    stream = PARSER.stream()
    assert stream.feed(f"Sure {partial}").content == "Sure "
    assert stream.feed("!").content == f"{partial}!"


def test_a_possible_tag_start_held_at_the_end_is_flushed_as_content() -> None:
    stream = PARSER.stream()
    assert stream.feed("a <tool").content == "a "
    assert stream.finish().content == "<tool"


def test_the_name_is_sent_once_the_header_is_complete_before_the_arguments() -> None:
    stream = PARSER.stream()
    assert stream.feed('<tool_call>\n{"name": "get_weather"').tool_calls == []
    (first,) = stream.feed(', "arguments": {').tool_calls
    assert (first.index, first.name, first.arguments) == (0, "get_weather", "{")
    assert first.id is not None


def test_arguments_stream_in_pieces_as_they_arrive() -> None:
    stream = PARSER.stream()
    stream.feed('<tool_call>\n{"name": "get_weather", "arguments": {')
    pieces = [stream.feed(piece).tool_calls for piece in ['"city": "Pa', 'ris"', "}"]]
    assert [p.arguments for (p,) in pieces] == ['"city": "Pa', 'ris"', "}"]
    assert all(p.id is None and p.name is None for (p,) in pieces)
    nothing = StreamDelta("", [])
    assert stream.feed("}\n</tool_call>") == nothing and stream.finish() == nothing


def test_a_less_than_sign_in_the_arguments_waits_only_until_it_is_not_the_closing_tag() -> None:
    stream = PARSER.stream()
    stream.feed('<tool_call>\n{"name": "f", "arguments": {"q": "a ')
    assert stream.feed("<").tool_calls == []
    assert stream.feed(" b").tool_calls[0].arguments == "< b"


def test_an_invalid_block_streams_as_content_once_it_cannot_be_a_call() -> None:
    stream = PARSER.stream()
    assert stream.feed("<tool_call>\n{'na").content == "<tool_call>\n{'na"


def test_an_unterminated_header_at_the_end_is_flushed_as_content() -> None:
    stream = PARSER.stream()
    assert stream.feed('<tool_call>\n{"name": "get_w').content == ""
    assert stream.finish().content == '<tool_call>\n{"name": "get_w'


def test_whitespace_between_calls_is_not_streamed_as_content() -> None:
    deltas = tool_deltas(PARSER, [CALL, "\n", CALL, "\n"])
    assert all(d.content == "" for d in deltas)
    assert [json.loads(c.arguments) for c in assemble_tool_deltas(deltas).tool_calls] == [
        {"city": "Paris"}] * 2


def test_leading_whitespace_goes_out_with_the_first_visible_content() -> None:
    stream = PARSER.stream()
    assert stream.feed("\n\n").content == ""
    assert stream.feed("Hi").content == "\n\nHi"
