"""gpt-oss's harmony turns read by the reader a harmony model's plan builds (the harmony
reasoning parser, then the harmony tool-call reader), whole and streamed split anywhere:
reasoning, content and calls as recorded, and never a marker in what a client gets."""

from __future__ import annotations

import json
import random

import pytest

from officellm.app.chat.chat_output import ChatDeltaParts, ChatMessageParts, ChatOutputReader
from officellm.app.chat.harmony import Header, template_history
from officellm.app.chat.reasoning_parsers import REASONING_PARSERS
from officellm.app.chat.tool_parsers import TOOL_CALL_PARSERS, ToolCall
from officellm.app.chat.tool_parsers.harmony import HarmonyToolParser
from tests.openai_parsers.recorded import HARMONY_OUTPUTS, TurnOutput
from tests.openai_parsers.streams import chunkings

READER = ChatOutputReader(REASONING_PARSERS["harmony"], TOOL_CALL_PARSERS["harmony"])


def _streamed(reader: ChatOutputReader, chunks: list[str]) -> ChatMessageParts:
    """The whole reply a stream's deltas make, checking OpenAI's streaming shape: a call's
    id and name in its first delta only, calls numbered in order."""
    stream = reader.stream()
    deltas: list[ChatDeltaParts] = [stream.feed(c) for c in chunks] + [stream.finish()]
    calls: list[ToolCall] = []
    for piece in (p for d in deltas for p in d.tool_calls):
        if piece.index == len(calls):
            assert piece.id is not None and piece.name is not None, piece
            calls.append(ToolCall(piece.id, piece.name, piece.arguments))
        else:
            assert (piece.index, piece.id, piece.name) == (len(calls) - 1, None, None), piece
            calls[-1] = ToolCall(calls[-1].id, calls[-1].name,
                                 calls[-1].arguments + piece.arguments)
    return ChatMessageParts("".join(d.content for d in deltas) or None,
                            "".join(d.reasoning for d in deltas) or None, calls)


def _read(parts: ChatMessageParts) -> tuple[str | None, str | None, list[tuple[str, object]]]:
    calls = []
    for call in parts.tool_calls:
        try:
            calls.append((call.name, json.loads(call.arguments)))
        except ValueError:
            calls.append((call.name, call.arguments))
    return parts.reasoning, parts.content, calls


@pytest.mark.parametrize("turn", HARMONY_OUTPUTS.values(), ids=HARMONY_OUTPUTS.keys())
def test_a_whole_turn_reads_as_recorded(turn: TurnOutput) -> None:
    assert _read(READER.message(turn.text)) == (turn.reasoning, turn.content, turn.calls)


@pytest.mark.parametrize("turn", HARMONY_OUTPUTS.values(), ids=HARMONY_OUTPUTS.keys())
def test_a_streamed_turn_split_anywhere_or_by_character_reads_as_recorded(
        turn: TurnOutput) -> None:
    for chunks in chunkings(turn.text):
        assert _read(_streamed(READER, chunks)) == (turn.reasoning, turn.content,
                                                    turn.calls), chunks


@pytest.mark.parametrize("turn", HARMONY_OUTPUTS.values(), ids=HARMONY_OUTPUTS.keys())
def test_no_marker_reaches_the_client(turn: TurnOutput) -> None:
    parts = READER.message(turn.text)
    shown = [parts.reasoning or "", parts.content or "",
             *(c.name + c.arguments for c in parts.tool_calls)]
    assert not any("<|" in text for text in shown), shown


def test_without_tools_a_call_is_left_out_and_the_rest_is_read() -> None:
    reader = ChatOutputReader(REASONING_PARSERS["harmony"], HarmonyToolParser(read_calls=False))
    turn = HARMONY_OUTPUTS["a preamble then a call, the recipient before the channel"]
    parts = reader.message(turn.text)
    assert (parts.reasoning, parts.content, parts.tool_calls) == (
        turn.reasoning, turn.content, [])


def test_without_a_reasoning_parser_the_analysis_is_content_without_its_markers() -> None:
    reader = ChatOutputReader(None, TOOL_CALL_PARSERS["harmony"])
    parts = reader.message(HARMONY_OUTPUTS["reasoning then the answer"].text)
    assert (parts.reasoning, parts.content) == (
        None, 'User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.\n2 + 2 = 4.')


def test_the_reasoning_parser_passes_the_rest_on_as_written() -> None:
    turn = HARMONY_OUTPUTS["reasoning then the answer"]
    parsed = REASONING_PARSERS["harmony"].parse(turn.text)
    assert parsed.content == "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>"


def test_reasoning_streams_before_its_message_ends() -> None:
    stream = READER.stream()
    assert stream.feed("<|channel|>analysis<|message|>Step one").reasoning == "Step one"
    assert stream.feed(", step two").reasoning == ", step two"


def test_a_call_streams_its_name_once_the_header_is_whole_and_its_arguments_as_written() -> None:
    stream = READER.stream()
    assert not stream.feed("<|channel|>commentary to=functions.add <|constrain|>json")
    (first,) = stream.feed('<|message|>{"a": ').tool_calls
    (more,) = stream.feed("2}").tool_calls
    assert (first.name, first.arguments, more.name, more.arguments) == (
        "add", '{"a": ', None, "2}")


@pytest.mark.parametrize(("header", "expected"), [
    ("<|channel|>analysis", Header("", "analysis", None, None)),
    ("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json",
     Header("assistant", "commentary", "functions.get_weather", "json")),
    ("<|start|>assistant to=functions.get_weather<|channel|>commentary json",
     Header("assistant", "commentary", "functions.get_weather", "json")),
    ("<|channel|>commentary to=functions.f<|constrain|>json",
     Header("", "commentary", "functions.f", "json")),
    (" to=functions.f<|channel|>commentary", Header("", "commentary", "functions.f", None)),
    ("<|start|>assistant", Header("assistant", None, None, None)),
], ids=["first analysis", "recipient after the channel", "recipient before the channel",
        "constrain without a space", "the first message's recipient", "no channel"])
def test_a_header_reads_its_role_channel_recipient_and_content_type(header: str,
                                                                    expected: Header) -> None:
    assert Header.parse(header) == expected


@pytest.mark.parametrize(("header", "kind"), [
    ("<|channel|>commentary to=functions.f json", "call"),
    ("<|channel|>analysis to=functions.f json", "call"),
    ("<|channel|>analysis", "reasoning"),
    ("<|channel|>analysis to=python", "reasoning"),
    ("<|channel|>commentary to=browser.search", "reasoning"),
    ("<|channel|>commentary", "content"),
    ("<|channel|>final", "content"),
])
def test_what_a_message_is_follows_its_recipient_then_its_channel(header: str, kind: str) -> None:
    assert Header.parse(header).kind == kind


def test_an_earlier_turns_reasoning_reaches_the_template_as_thinking() -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "f", "arguments": {}}}
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "Let me check.", "reasoning_content": "Need f.",
                 "tool_calls": [call]},
                {"role": "assistant", "content": "Done.", "reasoning": "All good."}]
    _, called, answered = template_history(messages)
    assert called["thinking"] == "Need f." and "content" not in called
    assert (answered["thinking"], answered["content"]) == ("All good.", "Done.")


_PIECES = ["<|channel|>analysis<|message|>hm", "<|end|>", "<|start|>assistant", "<|channel|>",
           "commentary", " to=functions.f", " <|constrain|>json", "<|message|>", '{"a": 1}',
           "<|call|>", "final", "ok", "<|return|>", "\n", " ", "<|", "é"]


def test_random_harmony_split_at_random_reads_as_the_whole() -> None:
    rng = random.Random("harmony")
    for _ in range(500):
        text = "".join(rng.choices(_PIECES, k=rng.randrange(12)))
        cuts = sorted(rng.sample(range(len(text) + 1), rng.randrange(min(8, len(text) + 1))))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        whole = READER.message(text)
        assert _read(_streamed(READER, chunks)) == _read(whole), chunks
