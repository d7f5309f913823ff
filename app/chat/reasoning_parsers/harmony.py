"""gpt-oss's reasoning: its harmony messages that are reasoning (app/chat/harmony.py: the
analysis channel, and messages to tools this server does not run).

The reasoning is the content of those messages, joined by a newline when there are several,
as vLLM joins them. The rest of the output (the answer, preambles, calls) is passed on as
`content` exactly as written, markers and all, for the harmony tool-call reader
(tool_parsers/harmony.py), which ChatFormats.plan always puts after this parser: only it
turns that text into what the user sees.
"""

from __future__ import annotations

from officellm.app.chat.harmony import HarmonyStream, Header
from officellm.app.chat.reasoning_parsers.base import ParsedReasoning, ReasoningDelta


class HarmonyReasoningParser:
    """Reasoning out of a harmony turn; the other messages passed on as written."""

    def parse(self, text: str) -> ParsedReasoning:
        """The reasoning and the rest of a whole output: the stream's reading of it in one
        piece, so the two cannot differ."""
        stream = self.stream()
        first, last = stream.feed(text), stream.finish()
        return ParsedReasoning(first.reasoning + last.reasoning or None,
                               first.content + last.content or None)

    def stream(self) -> HarmonyReasoningStream:
        """A new stream parse."""
        return HarmonyReasoningStream()


class HarmonyReasoningStream(HarmonyStream[ReasoningDelta]):
    """Each message's content goes to the reasoning or, with its markers, to the rest."""

    def __init__(self) -> None:
        super().__init__()
        self._reasoning: list[str] = []
        self._rest: list[str] = []
        self._in_reasoning = False
        self._said = False  # some reasoning was sent: a later message's starts on a new line
        self._message_said = False  # the current message's reasoning has begun

    def _take(self) -> ReasoningDelta:
        delta = ReasoningDelta("".join(self._reasoning), "".join(self._rest))
        self._reasoning, self._rest = [], []
        return delta

    def _open(self, header: Header, raw: str) -> None:
        self._in_reasoning = header.kind == "reasoning"
        self._message_said = False
        if not self._in_reasoning:
            self._rest.append(raw)

    def _text(self, text: str) -> None:
        if not self._in_reasoning:
            self._rest.append(text)
            return
        if self._said and not self._message_said:
            self._reasoning.append("\n")
        self._reasoning.append(text)
        self._said = self._message_said = True

    def _close(self, end: str) -> None:
        if not self._in_reasoning:
            self._rest.append(end)
