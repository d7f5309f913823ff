"""A chat choice's generated text read into OpenAI's message fields: reasoning first (the
thinking a reasoning model writes before its answer), then tool calls within the answer.

The same two parsers read a whole output and a stream of deltas, so a streamed reply
assembles to exactly the non-streamed one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from officellm.app.chat.reasoning_parsers import ReasoningParser
from officellm.app.chat.tool_parsers import ToolCall, ToolCallDelta, ToolCallParser


@dataclass(frozen=True)
class ChatMessageParts:
    """A whole reply: content (None when there is none besides tool calls), reasoning,
    tool calls."""

    content: str | None
    reasoning: str | None
    tool_calls: list[ToolCall]


@dataclass
class ChatDeltaParts:
    """What one stream step adds: text, reasoning text, tool-call pieces."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


@dataclass(frozen=True)
class ChatOutputReader:
    """The parsers a request's choices are read with (either may be absent)."""

    reasoning: ReasoningParser | None = None
    tools: ToolCallParser | None = None

    @property
    def is_plain(self) -> bool:
        return self.reasoning is None and self.tools is None

    def message(self, text: str) -> ChatMessageParts:
        """Read a whole output."""
        reasoning, content = None, text
        if self.reasoning is not None:
            parsed = self.reasoning.parse(text)
            reasoning, content = parsed.reasoning, parsed.content  # None: all thinking
        if self.tools is None or content is None:
            return ChatMessageParts(content, reasoning, [])
        calls = self.tools.parse(content)
        return ChatMessageParts(calls.content, reasoning, calls.tool_calls)

    def stream(self) -> ChatOutputStream:
        return ChatOutputStream(self)


class ChatOutputStream:
    """Reads one choice's stream of text deltas."""

    def __init__(self, reader: ChatOutputReader) -> None:
        self._reasoning = reader.reasoning.stream() if reader.reasoning is not None else None
        self._tools = reader.tools.stream() if reader.tools is not None else None

    def feed(self, text: str) -> ChatDeltaParts:
        """The parts `text` completes (some may be held back until later text decides)."""
        if self._reasoning is None:
            return self._answer("", text, final=False)
        d = self._reasoning.feed(text)
        return self._answer(d.reasoning, d.content, final=False)

    def finish(self) -> ChatDeltaParts:
        """Everything still held back, at the end of the output."""
        if self._reasoning is None:
            return self._answer("", "", final=True)
        d = self._reasoning.finish()
        return self._answer(d.reasoning, d.content, final=True)

    def _answer(self, reasoning: str, content: str, final: bool) -> ChatDeltaParts:
        if self._tools is None:
            return ChatDeltaParts(content, reasoning)
        d = self._tools.feed(content) if content else None
        parts = ChatDeltaParts(d.content if d else "", reasoning, list(d.tool_calls) if d else [])
        if final:
            end = self._tools.finish()
            parts.content += end.content
            parts.tool_calls += end.tool_calls
        return parts
