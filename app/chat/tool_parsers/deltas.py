"""Gathering what a tool call stream sends, under the same content rule as a whole output."""

from __future__ import annotations

from dataclasses import replace

from officellm.app.chat.tool_parsers.base import (
    ParsedToolOutput,
    StreamDelta,
    ToolCall,
    ToolCallDelta,
    new_call_id,
)


def visible_content(text: str) -> str | None:
    """A whole output's content: None when it is only whitespace, as OpenAI reports none."""
    return text if text.strip() else None


class DeltaBuilder:
    """Collects the content and call pieces of one feed() or finish(), then hands them over.

    Content that is still only whitespace is held back and goes out with the first visible
    character, never if none comes: so a stream sends content exactly when `visible_content`
    of the whole output is not None, and then sends all of it.
    """

    def __init__(self) -> None:
        self._content: list[str] = []
        self._calls: list[ToolCallDelta] = []
        self._blank = ""
        self._visible = False
        self._count = 0

    def content(self, text: str) -> None:
        if not self._visible:
            text, self._blank = self._blank + text, ""
            if not text.strip():
                self._blank = text
                return
            self._visible = True
        self._content.append(text)

    def start_call(self, name: str) -> None:
        self._calls.append(ToolCallDelta(self._count, new_call_id(), name, ""))
        self._count += 1

    def arguments(self, text: str) -> None:
        """More arguments text for the latest call, merged into its delta of this feed."""
        if not text:
            return
        last = self._calls[-1] if self._calls else None
        if last is not None and last.index == self._count - 1:
            self._calls[-1] = replace(last, arguments=last.arguments + text)
        else:
            self._calls.append(ToolCallDelta(self._count - 1, None, None, text))

    def take(self) -> StreamDelta:
        delta = StreamDelta("".join(self._content), self._calls)
        self._content, self._calls = [], []
        return delta


def assemble(deltas: list[StreamDelta]) -> ParsedToolOutput:
    """The whole output a stream's deltas make: its content (None when none was sent) and its
    calls, each from its first delta's id and name and all its deltas' arguments."""
    calls: list[ToolCall] = []
    for piece in (p for d in deltas for p in d.tool_calls):
        if piece.id is not None and piece.name is not None:
            calls.append(ToolCall(piece.id, piece.name, piece.arguments))
        else:
            last = calls[piece.index]
            calls[piece.index] = replace(last, arguments=last.arguments + piece.arguments)
    return ParsedToolOutput("".join(d.content for d in deltas) or None, calls)
