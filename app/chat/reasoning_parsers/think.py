"""Reasoning in `<think>...</think>` at the start of the output (Qwen3, DeepSeek-R1).

The reasoning is the text between the tags without the newlines that open and close it, and
the content the text after `</think>` without the newlines that open it: the same trimming
Qwen3's chat template applies when it renders a past turn's reasoning. Without `</think>` the
model was cut short while thinking: everything after the opening is reasoning.
"""

from __future__ import annotations

from officellm.app.chat.reasoning_parsers.base import ParsedReasoning, ReasoningDelta
from officellm.app.chat.stream_machine import StreamStateMachine

OPEN, CLOSE = "<think>", "</think>"


class ThinkReasoningParser:
    """`<think>` reasoning; `opened_in_prompt` for templates that end the prompt with
    `<think>` (DeepSeek-R1), whose output is reasoning from its first character (an opening
    tag repeated there is dropped). Otherwise (Qwen3) an output that does not start with
    `<think>` has no reasoning."""

    def __init__(self, opened_in_prompt: bool) -> None:
        self.opened_in_prompt = opened_in_prompt

    def parse(self, text: str) -> ParsedReasoning:
        """The reasoning and content of a whole output."""
        if text.startswith(OPEN):
            text = text[len(OPEN):]
        elif not self.opened_in_prompt:
            return ParsedReasoning(None, text or None)
        reasoning, _, content = text.partition(CLOSE)
        return ParsedReasoning(reasoning.strip("\n") or None, content.lstrip("\n") or None)

    def stream(self) -> ThinkStream:
        """A new stream parse."""
        return ThinkStream(self.opened_in_prompt)


class ThinkStream(StreamStateMachine[ReasoningDelta]):
    """The opening tag (or none), the reasoning up to `</think>`, then the answer."""

    def __init__(self, opened_in_prompt: bool) -> None:
        super().__init__(self._start)
        self._opened_in_prompt = opened_in_prompt
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._reasoning_sent = False
        self._newlines = ""  # the reasoning's trailing newlines: sent only if more follows

    def _take(self) -> ReasoningDelta:
        delta = ReasoningDelta("".join(self._reasoning), "".join(self._content))
        self._reasoning, self._content = [], []
        return delta

    def _start(self) -> bool:
        if self._buf.startswith(OPEN):
            self._buf = self._buf[len(OPEN):]
            return self._go(self._thinking)
        if not self._final and OPEN.startswith(self._buf):
            return False
        return self._go(self._thinking if self._opened_in_prompt else self._answer)

    def _thinking(self) -> bool:
        before, closed = self._until(CLOSE)
        text = self._newlines + before
        if not self._reasoning_sent:
            text = text.lstrip("\n")
        kept = text.rstrip("\n")
        self._newlines = text[len(kept):]
        if kept:
            self._reasoning.append(kept)
            self._reasoning_sent = True
        return closed and self._go(self._after_close)

    def _after_close(self) -> bool:
        self._buf = self._buf.lstrip("\n")
        return bool(self._buf) and self._go(self._answer)

    def _answer(self) -> bool:
        self._content.append(self._buf)
        self._buf = ""
        return False
