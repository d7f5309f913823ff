"""A forced call of a freeform tool (OpenAI's custom tools): the whole answer is the call's
input, raw text that the tool's grammar (where it has one) constrained. It is read as one
call whose arguments are {"input": <the answer>}, the shape every call of a freeform tool
has here (app/chat/tools.py FREEFORM_INPUT), so one reading serves both ways of calling."""

from __future__ import annotations

import json

from officellm.app.chat.tool_parsers.base import (
    ParsedToolOutput,
    StreamDelta,
    ToolCall,
    new_call_id,
)
from officellm.app.chat.tool_parsers.deltas import DeltaBuilder

INPUT_KEY = "input"


def _json_string_body(text: str) -> str:
    # Escapes are per character, so the pieces' bodies join into the whole text's body.
    return json.dumps(text, ensure_ascii=False)[1:-1]


class WholeAnswerCallParser:
    """Reads an answer as one call of `name`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def parse(self, text: str) -> ParsedToolOutput:
        """The call of a whole answer (no content beside it)."""
        arguments = json.dumps({INPUT_KEY: text}, ensure_ascii=False)
        return ParsedToolOutput(None, [ToolCall(new_call_id(), self.name, arguments)])

    def stream(self) -> WholeAnswerStream:
        """A new stream parse."""
        return WholeAnswerStream(self.name)


class WholeAnswerStream:
    """The call's arguments as the answer comes: the opening with the first piece, each
    piece JSON-escaped, the closing at the end."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._out = DeltaBuilder()
        self._started = False

    def feed(self, delta_text: str) -> StreamDelta:
        self._start()
        self._out.arguments(_json_string_body(delta_text))
        return self._out.take()

    def finish(self) -> StreamDelta:
        self._start()
        self._out.arguments('"}')
        return self._out.take()

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self._out.start_call(self._name)
            self._out.arguments(f'{{"{INPUT_KEY}": "')
