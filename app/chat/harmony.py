"""OpenAI's harmony format, as gpt-oss writes its turn, read as a stream of messages.

A turn is one or more messages, `<|start|>{header}<|message|>{content}{end}`; the prompt ends
with `<|start|>assistant`, so the first message's header starts right away, usually with
`<|channel|>`. The header names the channel (analysis: the chain of thought; commentary:
tool calls and the preambles before them; final: the answer), may name a recipient,
`to=functions.NAME` (a function call), before or after the channel, and may name the
content type (`<|constrain|>json`, or just `json`). A message ends at `<|end|>`, at
`<|call|>` (a call: the model stops) or `<|return|>` (the answer is done: it stops), or is
cut short by the end of the output. The markers are special tokens: the server keeps them
in this model's text (ChatFormats.plan) so these readers see them, and they never reach a
client.

What each message is, `Header.kind`, is decided here once for both readers
(reasoning_parsers/harmony.py, tool_parsers/harmony.py): a message to `functions.NAME` is a
call, whatever its channel; one on the analysis channel, or to another recipient (gpt-oss's
built-in browser and python tools, which this server does not run), is reasoning; the rest
(final, a commentary preamble, no channel) is content the user sees, as vLLM reads them.

An output that does not start like a harmony message (a grammar forced plain JSON, say) is
one message of content. The format is read as text, not with OpenAI's `openai-harmony`
package: that package needs its tiktoken vocabulary fetched at run time, which an office
server without internet cannot do, and the text already carries every marker.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from officellm.app.chat.stream_machine import StreamStateMachine

START, END, MESSAGE = "<|start|>", "<|end|>", "<|message|>"
CHANNEL, CONSTRAIN = "<|channel|>", "<|constrain|>"
RETURN, CALL = "<|return|>", "<|call|>"
END_OF_TEXT = "<|endoftext|>"  # gpt-oss's third stop token
FUNCTIONS = "functions."
RECIPIENT = "to="
# What ends a message's content: its end markers, and a next message begun without one.
_CONTENT_ENDS = (END, CALL, RETURN, END_OF_TEXT, START)
# How an output that is harmony begins: a header (the role is the prompt's), or a message.
_OPENINGS = (CHANNEL, START, MESSAGE, " " + RECIPIENT)

MessageKind = Literal["reasoning", "call", "content"]
Message = dict[str, Any]
Delta = TypeVar("Delta")


@dataclass(frozen=True)
class Header:
    """A message's header: role ("" for the turn's first message, whose role the prompt
    gave), channel, recipient and content type, each None when not written."""

    role: str
    channel: str | None
    recipient: str | None
    content_type: str | None

    @classmethod
    def parse(cls, text: str) -> Header:
        """The header written between a message's start and `<|message|>`."""
        text = text.removeprefix(START).replace(CONSTRAIN, " ")
        before, has_channel, after = text.partition(CHANNEL)
        role_words = before.split()
        channel_words = after.split() if has_channel else []
        recipient = next((w[len(RECIPIENT):] for w in role_words + channel_words
                          if w.startswith(RECIPIENT)), None)
        role = next((w for w in role_words if not w.startswith(RECIPIENT)), "")
        rest = [w for w in channel_words if not w.startswith(RECIPIENT)]
        channel = rest[0] if rest else None
        return cls(role, channel, recipient, rest[-1] if len(rest) > 1 else None)

    @property
    def function(self) -> str | None:
        """The function a call message is to (its recipient without `functions.`)."""
        if self.recipient is None or not self.recipient.startswith(FUNCTIONS):
            return None
        return self.recipient[len(FUNCTIONS):] or None

    @property
    def kind(self) -> MessageKind:
        if self.function is not None:
            return "call"
        if self.channel == "analysis" or self.recipient is not None:
            return "reasoning"
        return "content"


PLAIN = Header("", None, None, None)  # an output that is not harmony: all content


def is_harmony_template(chat_template: str | None) -> bool:
    """Whether `chat_template` writes the harmony format (gpt-oss's): its messages'
    `<|channel|>` marker is in no other family's template."""
    return chat_template is not None and CHANNEL in chat_template


def call_begin(function: str) -> str:
    """How gpt-oss begins a call of `function` (after the turn's `<|start|>assistant`)."""
    return f"{CHANNEL}commentary {RECIPIENT}{FUNCTIONS}{function} {CONSTRAIN}json{MESSAGE}"


def template_history(messages: list[Message]) -> list[Message]:
    """Messages as gpt-oss's chat template reads them: an earlier turn's reasoning (the
    server's `reasoning_content`, vLLM's `reasoning`) as `thinking`, which the template
    renders before that turn's tool call (it drops it once a final answer follows). The
    template refuses a call message with both content and thinking: the thinking, the
    chain of thought the call came from, is kept."""
    out = []
    for message in messages:
        thinking = message.get("reasoning_content") or message.get("reasoning")
        if message.get("role") != "assistant" or not thinking or "thinking" in message:
            out.append(message)
            continue
        shaped = {**message, "thinking": thinking}
        if shaped.get("tool_calls"):
            shaped.pop("content", None)
        out.append(shaped)
    return out


def after_analysis(then: dict[str, Any]) -> dict[str, Any]:
    """An xgrammar structural-tag format for a gpt-oss turn: its analysis message if it
    writes one (any text), then `then`, a message that begins with its `<|channel|>`."""
    analysis = {"type": "tag", "begin": f"{CHANNEL}analysis{MESSAGE}",
                "content": {"type": "any_text"}, "end": f"{END}{START}assistant"}
    return {"type": "sequence", "elements": [{"type": "optional", "content": analysis}, then]}


def answer_format(content: dict[str, Any]) -> dict[str, Any]:
    """A gpt-oss turn whose answer (its final message) is `content`, an xgrammar format; the
    grammar ends with the content, where the model's own `<|return|>` may end the turn."""
    return after_analysis({"type": "tag", "begin": f"{CHANNEL}final{MESSAGE}",
                           "content": content, "end": ""})


class HarmonyStream(StreamStateMachine[Delta]):
    """A harmony output's messages as they stream: each message's header once whole
    (`_open`), its content as it comes (`_text`, never a piece of a marker) and its end
    (`_close`), with the exact text each consumed, so a reader can pass a message on as
    written. A header cut short by the end of the output had no content: it is dropped."""

    def __init__(self) -> None:
        super().__init__(self._start)
        self._header = ""  # the header's text so far

    @abstractmethod
    def _open(self, header: Header, raw: str) -> None:
        """A message begins; `raw` is its header as written, `<|message|>` included."""

    @abstractmethod
    def _text(self, text: str) -> None:
        """More of the current message's content."""

    @abstractmethod
    def _close(self, end: str) -> None:
        """The current message ends at `end` ("" at the output's end, or when the next
        message begins without an end marker)."""

    def _start(self) -> bool:
        if self._buf.startswith(_OPENINGS):
            return self._go(self._read_header)
        if not self._final and any(o.startswith(self._buf) for o in _OPENINGS):
            return False  # may still become an opening
        self._open(PLAIN, "")
        return self._go(self._read_content)

    def _read_header(self) -> bool:
        before, found = self._until(MESSAGE)
        self._header += before
        if not found:
            return False
        raw, self._header = self._header, ""
        self._open(Header.parse(raw), raw + MESSAGE)
        return self._go(self._read_content)

    def _read_content(self) -> bool:
        before, end = self._until_any(_CONTENT_ENDS)
        if before:
            self._text(before)
        if end is None:
            if self._final:
                self._close("")
                return self._go(self._ended)
            return False
        if end == START:  # the next message, begun without an end marker
            self._close("")
            self._header = START
        else:
            self._close(end)
        return self._go(self._read_header)

    def _ended(self) -> bool:
        return False
