"""What a tool call parser reads out of a model's text, and the interface every parser has."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ToolCall:
    """One function call of a whole output; `arguments` is the JSON text of an object."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a streamed call, OpenAI's shape: `id` and `name` only in a call's first
    delta; the call's `arguments` is the concatenation of its deltas' `arguments`."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(frozen=True)
class ParsedToolOutput:
    """A whole output: the text outside the calls (None when blank, as OpenAI) and the calls."""

    content: str | None
    tool_calls: list[ToolCall]


@dataclass(frozen=True)
class StreamDelta:
    """What one piece of streamed text adds: content and call pieces ("" and [] for none)."""

    content: str
    tool_calls: list[ToolCallDelta]


class ToolCallStream(Protocol):
    """The parse of one streamed output, fed its text deltas in order."""

    def feed(self, delta_text: str) -> StreamDelta:
        """What `delta_text` adds; text that might still turn into markup is held back."""
        ...

    def finish(self) -> StreamDelta:
        """The text held back at the end; markup that never became a call goes out as content."""
        ...


class ToolCallParser(Protocol):
    """A model family's tool call format, for whole outputs and for streams."""

    def parse(self, text: str) -> ParsedToolOutput:
        """The content and calls of a whole output."""
        ...

    def stream(self) -> ToolCallStream:
        """A new stream parse; its deltas assemble to what `parse` gives for the whole text."""
        ...


def new_call_id() -> str:
    """A fresh tool call id in OpenAI's form: "call_" and 24 hex digits."""
    return "call_" + secrets.token_hex(12)
