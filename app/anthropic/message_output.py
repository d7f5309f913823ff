"""A chat choice as read by its ChatOutputReader (app/chat/chat_output.py), in the Messages
API's terms: whole, its content blocks and stop reason; streamed, the numbered block events
that build the same blocks.

Blocks come in the order the model writes them: its thinking, its answer's text, its tool
calls. A streamed reply assembles to exactly the whole one, because both read the same
parsers' output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from officellm.app.anthropic.answers import (
    ContentBlockDelta,
    ContentBlockStart,
    ContentBlockStop,
    InputJSONDelta,
    MessageDelta,
    MessageObject,
    MessageStart,
    MessageStop,
    OutBlock,
    SignatureDelta,
    StopDetails,
    StopReason,
    StreamEvent,
    TextDelta,
    TextOut,
    ThinkingDelta,
    ThinkingOut,
    ToolUseOut,
    Usage,
)
from officellm.app.chat.chat_output import ChatDeltaParts, ChatMessageParts
from officellm.engine import CompletionOutput


def tool_use_id(call_id: str) -> str:
    """A call's id in Anthropic's form: "toolu_" and the call's own random part."""
    return "toolu_" + call_id.removeprefix("call_")


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as tool_use's `input` object. A call cut short (max_tokens, the
    window) has no whole object: its input is {}, and the message's stop_reason says it was
    cut (the stream had sent the partial JSON as it came, as Anthropic's does)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def content_blocks(parts: ChatMessageParts, show_thinking: bool) -> list[OutBlock]:
    """The content blocks of a whole reply (thinking without its text when not shown)."""
    blocks: list[OutBlock] = []
    if parts.reasoning:
        blocks.append(ThinkingOut(thinking=parts.reasoning if show_thinking else ""))
    if parts.content:
        blocks.append(TextOut(text=parts.content))
    blocks += [ToolUseOut(id=tool_use_id(t.id), name=t.name, input=tool_input(t.arguments))
               for t in parts.tool_calls]
    return blocks


@dataclass(frozen=True)
class Stop:
    """Why a message ended, in Anthropic's words."""

    reason: StopReason
    sequence: str | None = None

    @classmethod
    def of(cls, output: CompletionOutput, stop_sequences: list[str], called: bool,
           window_full: bool) -> Stop:
        """model_context_window_exceeded when the context window cut it (a max_tokens past
        the window runs to the window: app/models/prompt.py), max_tokens when max_tokens
        did, stop_sequence naming the one matched, tool_use when it ended in calls, else
        end_turn (the model's own end)."""
        if output.finish_reason == "length":
            return cls("model_context_window_exceeded" if window_full else "max_tokens")
        if isinstance(output.stop_reason, str) and output.stop_reason in stop_sequences:
            return cls("stop_sequence", output.stop_reason)
        return cls("tool_use" if called else "end_turn")


def whole_message(message: MessageObject, parts: ChatMessageParts, stop: Stop,
                  show_thinking: bool) -> MessageObject:
    """The finished message: `message` (id, model, usage) with its blocks and stop."""
    return message.model_copy(update={"content": content_blocks(parts, show_thinking),
                                      "stop_reason": stop.reason,
                                      "stop_sequence": stop.sequence})


class MessageEventWriter:
    """Turns one choice's stream of parts into the Messages API's events, numbering the
    content blocks and opening and closing each around its deltas."""

    def __init__(self, message: MessageObject, show_thinking: bool) -> None:
        self._message = message
        self._show_thinking = show_thinking
        self._index = -1
        self._open: str | None = None  # "thinking", "text" or "tool_use"
        self.called = False  # whether a tool_use block was written

    def start(self, usage: Usage) -> list[StreamEvent]:
        """message_start: the message without content, and the prompt's usage so far."""
        return [MessageStart(message=self._message.model_copy(update={"usage": usage}))]

    def feed(self, parts: ChatDeltaParts) -> list[StreamEvent]:
        """The events of one step's parts, in the order the model wrote them."""
        events: list[StreamEvent] = []
        if parts.reasoning:
            events += self._enter("thinking", ThinkingOut(thinking=""))
            if self._show_thinking:
                events.append(self._delta(ThinkingDelta(thinking=parts.reasoning)))
        if parts.content:
            events += self._enter("text", TextOut(text=""))
            events.append(self._delta(TextDelta(text=parts.content)))
        for call in parts.tool_calls:
            if call.id is not None:  # a call's first delta: a new block
                assert call.name is not None
                events += self._enter("tool_use", ToolUseOut(id=tool_use_id(call.id),
                                                             name=call.name, input={}))
                self.called = True
            if call.arguments:
                events.append(self._delta(InputJSONDelta(partial_json=call.arguments)))
        return events

    def finish(self, stop: Stop, usage: Usage) -> list[StreamEvent]:
        """The open block closed, then why the message stopped and its usage."""
        return [*self._close(),
                MessageDelta(delta=StopDetails(stop_reason=stop.reason,
                                               stop_sequence=stop.sequence), usage=usage),
                MessageStop()]

    def _enter(self, kind: str, block: OutBlock) -> list[StreamEvent]:
        if self._open == kind and kind != "tool_use":
            return []
        events = self._close()
        self._index += 1
        self._open = kind
        return [*events, ContentBlockStart(index=self._index, content_block=block)]

    def _delta(self, delta: TextDelta | ThinkingDelta | SignatureDelta | InputJSONDelta
               ) -> ContentBlockDelta:
        return ContentBlockDelta(index=self._index, delta=delta)

    def _close(self) -> list[StreamEvent]:
        if self._open is None:
            return []
        events: list[StreamEvent] = []
        if self._open == "thinking":  # Anthropic's thinking blocks end with their signature
            events.append(self._delta(SignatureDelta(signature="")))
        events.append(ContentBlockStop(index=self._index))
        self._open = None
        return events
