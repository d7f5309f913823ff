"""Running the parsers' streams over chosen splits of a text, and assembling what they send."""

from __future__ import annotations

from collections.abc import Iterable

from officellm.app.chat.reasoning_parsers import ParsedReasoning, ReasoningParser
from officellm.app.chat.tool_parsers import ParsedToolOutput, StreamDelta, ToolCall, ToolCallParser


def chunkings(text: str) -> Iterable[list[str]]:
    """The text in two deltas split at every boundary (an empty one at either end), then one
    character at a time."""
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]
    yield list(text)


def tool_deltas(parser: ToolCallParser, chunks: Iterable[str]) -> list[StreamDelta]:
    stream = parser.stream()
    return [stream.feed(chunk) for chunk in chunks] + [stream.finish()]


def assemble_tool_deltas(deltas: list[StreamDelta]) -> ParsedToolOutput:
    """The whole output the deltas make, checking OpenAI's streaming shape on the way: calls
    numbered from 0 in order, each call's id and name in its first delta and only there."""
    content = "".join(d.content for d in deltas)
    calls: list[ToolCall] = []
    for piece in (p for d in deltas for p in d.tool_calls):
        if piece.index == len(calls):
            assert piece.id is not None and piece.name is not None, piece
            calls.append(ToolCall(piece.id, piece.name, piece.arguments))
        else:
            assert piece.index == len(calls) - 1, (piece, len(calls))
            assert piece.id is None and piece.name is None, piece
            call = calls[-1]
            calls[-1] = ToolCall(call.id, call.name, call.arguments + piece.arguments)
    return ParsedToolOutput(content or None, calls)


def streamed_tool_output(parser: ToolCallParser, chunks: Iterable[str]) -> ParsedToolOutput:
    return assemble_tool_deltas(tool_deltas(parser, chunks))


def streamed_reasoning(parser: ReasoningParser, chunks: Iterable[str]) -> ParsedReasoning:
    stream = parser.stream()
    deltas = [stream.feed(chunk) for chunk in chunks] + [stream.finish()]
    return ParsedReasoning("".join(d.reasoning for d in deltas) or None,
                           "".join(d.content for d in deltas) or None)


def without_ids(output: ParsedToolOutput) -> tuple[str | None, list[tuple[str, str]]]:
    return output.content, [(call.name, call.arguments) for call in output.tool_calls]
