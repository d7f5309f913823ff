"""Hermes-style tool calls, as Qwen2.5, Qwen3 and Hermes models write them:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

any number of blocks; the text outside them is content, verbatim (None when it is only
whitespace). A block that does not open with a call header (json_call.py) is content, tags
and all. A block ends at the first `</tool_call>`, even one inside a JSON string (the
format has no way to escape it), or at the end of the output when the model was cut short.
"""

from __future__ import annotations

from officellm.app.chat.stream_machine import StreamStateMachine
from officellm.app.chat.tool_parsers.base import (
    ParsedToolOutput,
    StreamDelta,
    ToolCall,
    new_call_id,
)
from officellm.app.chat.tool_parsers.deltas import DeltaBuilder, visible_content
from officellm.app.chat.tool_parsers.json_call import (
    CallHeader,
    ObjectScanner,
    Unmatched,
    match_header,
    read_call,
)

START, END = "<tool_call>", "</tool_call>"
_KEYS = ("arguments",)


class HermesToolParser:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks."""

    def parse(self, text: str) -> ParsedToolOutput:
        """The content and calls of a whole output."""
        content: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        while (start := text.find(START, pos)) >= 0:
            content.append(text[pos:start])
            body_at = start + len(START)
            end = text.find(END, body_at)
            pos = len(text) if end < 0 else end + len(END)
            call = read_call(text[body_at:len(text) if end < 0 else end], _KEYS)
            if call is None:
                content.append(text[start:pos])
            else:
                calls.append(ToolCall(new_call_id(), call.name, call.arguments))
        content.append(text[pos:])
        return ParsedToolOutput(visible_content("".join(content)), calls)

    def stream(self) -> HermesStream:
        """A new stream parse."""
        return HermesStream()


class HermesStream(StreamStateMachine[StreamDelta]):
    """Text, then each block: a call's header, its arguments and the rest of the block, or a
    block that is no call, sent verbatim."""

    def __init__(self) -> None:
        super().__init__(self._text)
        self._out = DeltaBuilder()
        self._arguments_end = ObjectScanner()

    def _take(self) -> StreamDelta:
        return self._out.take()

    def _text(self) -> bool:
        before, found = self._until(START)
        self._out.content(before)
        return found and self._go(self._header)

    def _header(self) -> bool:
        end = self._buf.find(END)
        header = match_header(self._buf if end < 0 else self._buf[:end], _KEYS)
        if isinstance(header, CallHeader):
            self._out.start_call(header.name)
            self._buf = self._buf[header.arguments_at:]
            self._arguments_end = ObjectScanner()
            return self._go(self._arguments)
        if header is Unmatched.NEED_MORE and end < 0 and not self._final:
            return False
        self._out.content(START)
        return self._go(self._verbatim)

    def _verbatim(self) -> bool:
        """A block that is not a call, sent as content."""
        before, found = self._until(END)
        self._out.content(before + END if found else before)
        return found and self._go(self._text)

    def _arguments(self) -> bool:
        before, found = self._until(END)
        closed = self._arguments_end.feed(before)
        self._out.arguments(before if closed is None else before[:closed])
        if found:
            return self._go(self._text)
        return closed is not None and self._go(self._rest_of_call)

    def _rest_of_call(self) -> bool:
        """After the arguments, up to the block's end: not read (json_call.py)."""
        _, found = self._until(END)
        return found and self._go(self._text)
