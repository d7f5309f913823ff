"""Llama 3.1/3.2 JSON tool calls: the whole output is the calls,

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": ...}

the tag optional, "arguments" accepted for "parameters", the calls separated by `;` or
whitespace. An output that does not open (after whitespace) with `{` or the tag is content,
and so is the whole output if its first call has no well-formed header (json_call.py). After
a call, text that is not another call is content from its first character; a later `{` that
opens no call header is content from that `{` on.
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
    WHITESPACE,
    CallHeader,
    ObjectScanner,
    Unmatched,
    match_header,
    read_call,
)

PYTHON_TAG = "<|python_tag|>"
_KEYS = ("parameters", "arguments")
_SEPARATORS = WHITESPACE + ";"


def _calls_start(text: str) -> int | None:
    """Where the first call begins, past leading whitespace and the tag; None if the output
    is plain content."""
    rest = text.lstrip(WHITESPACE)
    if rest.startswith(PYTHON_TAG):
        return len(text) - len(rest) + len(PYTHON_TAG)
    return len(text) - len(rest) if rest.startswith("{") else None


class Llama3JsonToolParser:
    """Llama 3's `{"name": ..., "parameters": {...}}` calls."""

    def parse(self, text: str) -> ParsedToolOutput:
        """The content and calls of a whole output."""
        pos = _calls_start(text)
        if pos is None:
            return ParsedToolOutput(visible_content(text), [])
        calls: list[ToolCall] = []
        while (call := read_call(text[pos:], _KEYS)) is not None:
            calls.append(ToolCall(new_call_id(), call.name, call.arguments))
            rest = text[pos + call.end:].lstrip(_SEPARATORS)
            pos = len(text) - len(rest)
            if not rest.startswith("{"):
                break
        return ParsedToolOutput(visible_content(text[pos:] if calls else text), calls)

    def stream(self) -> Llama3JsonStream:
        """A new stream parse."""
        return Llama3JsonStream()


class Llama3JsonStream(StreamStateMachine[StreamDelta]):
    """The opening (whitespace, the tag), then each call's header, its arguments and the rest
    of its object, the separators between calls, and content once the calls end."""

    def __init__(self) -> None:
        super().__init__(self._start)
        self._out = DeltaBuilder()
        self._lead = ""  # what precedes the first call: content too if that call fails
        self._object_end = ObjectScanner()

    def _take(self) -> StreamDelta:
        return self._out.take()

    def _start(self) -> bool:
        at = _calls_start(self._buf)
        if at is not None:
            self._lead, self._buf = self._buf[:at], self._buf[at:]
            return self._go(self._header)
        if not self._final and PYTHON_TAG.startswith(self._buf.lstrip(WHITESPACE)):
            return False
        return self._go(self._content)

    def _header(self) -> bool:
        header = match_header(self._buf, _KEYS)
        if isinstance(header, CallHeader):
            self._out.start_call(header.name)
            self._buf, self._lead = self._buf[header.arguments_at:], ""
            self._object_end = ObjectScanner()
            return self._go(self._arguments)
        if header is Unmatched.NEED_MORE and not self._final:
            return False
        self._buf = self._lead + self._buf
        return self._go(self._content)

    def _arguments(self) -> bool:
        closed = self._object_end.feed(self._buf)
        if closed is None:
            self._out.arguments(self._buf)
            self._buf = ""
            return False
        self._out.arguments(self._buf[:closed])
        self._buf = self._buf[closed:]
        self._object_end = ObjectScanner(depth=1)
        return self._go(self._rest_of_call)

    def _rest_of_call(self) -> bool:
        """After the arguments, up to the call object's end: not read (json_call.py)."""
        closed = self._object_end.feed(self._buf)
        self._buf = "" if closed is None else self._buf[closed:]
        return closed is not None and self._go(self._between)

    def _between(self) -> bool:
        self._buf = self._buf.lstrip(_SEPARATORS)
        if not self._buf:
            return False
        return self._go(self._header if self._buf.startswith("{") else self._content)

    def _content(self) -> bool:
        self._out.content(self._buf)
        self._buf = ""
        return False
