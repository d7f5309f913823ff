"""Every recorded output, streamed however it is split, assembles to its non-stream parse."""

from __future__ import annotations

import json
import random

import pytest

from officellm.app.chat.reasoning_parsers import REASONING_PARSERS
from officellm.app.chat.tool_parsers import TOOL_CALL_PARSERS
from tests.openai_parsers.recorded import REASONING_OUTPUTS, TOOL_OUTPUTS, ToolOutput
from tests.openai_parsers.streams import (
    chunkings,
    streamed_reasoning,
    streamed_tool_output,
    tool_deltas,
    without_ids,
)


def _assert_calls_as_recorded(calls, recorded: ToolOutput) -> None:
    assert [call.name for call in calls] == [name for name, _ in recorded.calls]
    for call, (_, arguments) in zip(calls, recorded.calls):
        if isinstance(arguments, dict):
            assert json.loads(call.arguments) == arguments
        else:
            assert call.arguments == arguments


@pytest.mark.parametrize("recorded", TOOL_OUTPUTS.values(), ids=TOOL_OUTPUTS.keys())
def test_parse_reads_the_recorded_tool_output(recorded: ToolOutput) -> None:
    parsed = TOOL_CALL_PARSERS[recorded.parser].parse(recorded.text)
    assert parsed.content == recorded.content
    _assert_calls_as_recorded(parsed.tool_calls, recorded)


@pytest.mark.parametrize("recorded", TOOL_OUTPUTS.values(), ids=TOOL_OUTPUTS.keys())
def test_tool_stream_split_anywhere_or_by_character_assembles_to_the_parse(
        recorded: ToolOutput) -> None:
    parser = TOOL_CALL_PARSERS[recorded.parser]
    expected = without_ids(parser.parse(recorded.text))
    for chunks in chunkings(recorded.text):
        assert without_ids(streamed_tool_output(parser, chunks)) == expected, chunks


@pytest.mark.parametrize("recorded", TOOL_OUTPUTS.values(), ids=TOOL_OUTPUTS.keys())
def test_streamed_call_id_and_name_come_once_in_the_calls_first_delta(
        recorded: ToolOutput) -> None:
    deltas = tool_deltas(TOOL_CALL_PARSERS[recorded.parser], list(recorded.text))
    pieces = [p for d in deltas for p in d.tool_calls]
    firsts = {}
    for piece in pieces:
        firsts.setdefault(piece.index, piece)
    assert [(p.id is not None, p.name is not None) for p in pieces] == [
        (p is firsts[p.index],) * 2 for p in pieces]
    assert [p.name for p in firsts.values()] == [name for name, _ in recorded.calls]


@pytest.mark.parametrize("recorded", REASONING_OUTPUTS.values(), ids=REASONING_OUTPUTS.keys())
def test_parse_reads_the_recorded_reasoning_output(recorded) -> None:
    parsed = REASONING_PARSERS[recorded.parser].parse(recorded.text)
    assert (parsed.reasoning, parsed.content) == (recorded.reasoning, recorded.content)


@pytest.mark.parametrize("recorded", REASONING_OUTPUTS.values(), ids=REASONING_OUTPUTS.keys())
def test_reasoning_stream_split_anywhere_or_by_character_assembles_to_the_parse(
        recorded) -> None:
    parser = REASONING_PARSERS[recorded.parser]
    expected = parser.parse(recorded.text)
    for chunks in chunkings(recorded.text):
        assert streamed_reasoning(parser, chunks) == expected, chunks


# Whole calls and thoughts, pieces of markup, near-misses and awkward characters: shuffled and
# then corrupted, they make outputs no model wrote but that a parser must still agree on.
_UNITS = ['<tool_call>\n{"name": "f", "arguments": {"a": "x}", "b": [1, {"c": "\\"<"}]}}\n'
          '</tool_call>', '{"name": "g", "parameters": {"q": "{[\\\\"}}', "<think>\nhm\n</think>\n\n",
          "<|channel|>analysis<|message|>hm<|end|>",
          '<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>'
          '{"a": 1}<|call|>', "<|start|>assistant<|channel|>final<|message|>ok<|return|>"]
_FRAGMENTS = ["<tool_call>", "</tool_call>", "<|python_tag|>", '{"name": "f", "arguments": ',
              '{"name": ""', "{", "}", "[", "]", '"', "\\", '"k": ', ", ", "\n", " ", ";", "hi",
              "<", "<think>", "</think>", "é", "<|start|>", "<|channel|>", "<|message|>",
              "<|end|>", "<|call|>", " to=functions.g", "<|constrain|>", "<|"]


def _random_output(rng: random.Random) -> str:
    pieces = rng.choices(_UNITS, k=rng.randrange(4)) + rng.choices(_FRAGMENTS, k=rng.randrange(4))
    rng.shuffle(pieces)
    text = "".join(pieces)
    for _ in range(rng.randrange(3)):
        at = rng.randrange(len(text) + 1)
        if rng.random() < 0.5:
            text = text[:at] + text[at + rng.randrange(1, 4):]
        else:
            text = text[:at] + rng.choice(_FRAGMENTS) + text[at:]
    return text


@pytest.mark.parametrize("name", [*TOOL_CALL_PARSERS, *REASONING_PARSERS])
def test_streams_of_random_markup_split_at_random_assemble_to_the_parse(name: str) -> None:
    rng = random.Random(name)
    for _ in range(500):
        text = _random_output(rng)
        cuts = sorted(rng.sample(range(len(text) + 1), rng.randrange(min(8, len(text) + 1))))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        if name in TOOL_CALL_PARSERS:
            parser = TOOL_CALL_PARSERS[name]
            assert without_ids(streamed_tool_output(parser, chunks)) == \
                without_ids(parser.parse(text)), chunks
        else:
            parser = REASONING_PARSERS[name]
            assert streamed_reasoning(parser, chunks) == parser.parse(text), chunks
