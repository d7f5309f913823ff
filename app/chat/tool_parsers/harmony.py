"""gpt-oss's tool calls and answer, out of its harmony messages (app/chat/harmony.py):

    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json
    <|message|>{"city": "Paris"}<|call|>

(one line on the wire). A message to `functions.NAME` is a call of NAME whose arguments are
its content as written (a call cut short by max_tokens passes on what there is, as the other
parsers do); the content of the answer (final) and preamble (commentary without a recipient)
messages is the reply's content, joined by a newline when there are several, and no marker
ever reaches it. Reasoning messages reach this reader only when no reasoning parser took
them out (--reasoning-parser none): their content is then content too.

`read_calls` False, for a request without tools: a call the model makes anyway (it was shown
no function) is left out of the reply, as vLLM leaves it out, rather than sent to a client
that offered none.
"""

from __future__ import annotations

from typing import Literal

from officellm.app.chat.harmony import HarmonyStream, Header
from officellm.app.chat.tool_parsers.base import ParsedToolOutput, StreamDelta
from officellm.app.chat.tool_parsers.deltas import DeltaBuilder, assemble


class HarmonyToolParser:
    """Calls, preambles and the answer of a harmony turn."""

    def __init__(self, read_calls: bool = True) -> None:
        self.read_calls = read_calls

    def parse(self, text: str) -> ParsedToolOutput:
        """The content and calls of a whole output: the stream's reading of it in one piece,
        so the two cannot differ."""
        stream = self.stream()
        return assemble([stream.feed(text), stream.finish()])

    def stream(self) -> HarmonyToolStream:
        """A new stream parse."""
        return HarmonyToolStream(self.read_calls)


class HarmonyToolStream(HarmonyStream[StreamDelta]):
    """Each message's content goes to the content, to a call's arguments, or nowhere."""

    def __init__(self, read_calls: bool) -> None:
        super().__init__()
        self._read_calls = read_calls
        self._out = DeltaBuilder()
        self._to: Literal["content", "call", "nowhere"] = "content"
        self._said = False  # some content was given: a later message's starts on a new line
        self._message_said = False

    def _take(self) -> StreamDelta:
        return self._out.take()

    def _open(self, header: Header, raw: str) -> None:
        self._message_said = False
        if header.function is None:
            self._to = "content"
        elif self._read_calls:
            self._out.start_call(header.function)
            self._to = "call"
        else:
            self._to = "nowhere"

    def _text(self, text: str) -> None:
        if self._to == "call":
            self._out.arguments(text)
        elif self._to == "content":
            if self._said and not self._message_said:
                text = "\n" + text
            self._out.content(text)
            self._said = self._message_said = True

    def _close(self, end: str) -> None:
        pass
