"""A chat choice as read by its ChatOutputReader (app/chat/chat_output.py), in the Responses
API's terms: whole, its output items; streamed, the numbered events that build the same items.

Items come in the order the model writes them: its reasoning, its answer's text, its calls.
A reply always has a message or a call (one with neither is an empty message). When the
output was cut (max_output_tokens, the context), the last item is "incomplete", and so is
the response.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Literal

from officellm.app.chat.chat_output import ChatDeltaParts, ChatMessageParts
from officellm.app.chat.tool_parsers import ToolCallDelta
from officellm.app.chat.tools import FREEFORM_INPUT
from officellm.app.openai.responses_api_models import (
    ContentPartEvent,
    CustomToolCallInputDeltaEvent,
    CustomToolCallInputDoneEvent,
    FunctionCallArgumentsDeltaEvent,
    FunctionCallArgumentsDoneEvent,
    IncompleteDetails,
    ItemStatus,
    OutputCustomToolCall,
    OutputFunctionCall,
    OutputItem,
    OutputItemEvent,
    OutputMessage,
    OutputReasoning,
    OutputText,
    OutputTextDeltaEvent,
    OutputTextDoneEvent,
    ReasoningTextDeltaEvent,
    ReasoningTextDoneEvent,
    ReasoningTextPart,
    ResponseError,
    ResponseLifecycleEvent,
    ResponseObject,
    ResponseStatus,
    ResponseStreamEvent,
    ResponseUsage,
)
from officellm.app.openai.responses_protocol import ToolNames


def item_id(prefix: str) -> str:
    """A fresh output item id: msg_..., fc_... or rs_..., as OpenAI's."""
    return f"{prefix}_{uuid.uuid4().hex}"


def response_status(finish_reason: str | None) -> tuple[ResponseStatus, IncompleteDetails | None]:
    """A response's status for its choice's finish reason: "incomplete" when max_output_tokens
    or the context cut it (OpenAI's reason max_output_tokens) or it was aborted (no reason)."""
    if finish_reason == "length":
        return "incomplete", IncompleteDetails(reason="max_output_tokens")
    if finish_reason == "abort":
        return "incomplete", IncompleteDetails(reason=None)
    return "completed", None


# The opening of a freeform call's arguments, {"input": "..., as the model writes it.
_INPUT_OPENING = re.compile(r'\s*\{\s*"' + FREEFORM_INPUT + r'"\s*:\s*"')


def _input_so_far(arguments: str) -> str:
    """The decoded part of a custom tool's input that its call's arguments hold so far
    ({"input": "... cut anywhere): what a stream can send before the call is whole."""
    opening = _INPUT_OPENING.match(arguments)
    if opening is None:
        return ""
    body = arguments[opening.end():]
    i = 0
    while i < len(body) and body[i] != '"':
        if body[i] != "\\":
            i += 1
            continue
        width = 2
        if body[i + 1:i + 2] == "u":
            # A high surrogate's escape waits for its pair's: half a character is none.
            high = body[i + 2:i + 4].lower() in ("d8", "d9", "da", "db")
            width = 12 if high else 6
        if i + width > len(body):
            break
        i += width
    try:
        return json.loads(f'"{body[:i]}"')
    except ValueError:
        return ""


def custom_input(arguments: str) -> str:
    """A custom tool's input from its call's arguments, {"input": <text>}; from arguments
    that are not that object (a model's slip, or a call cut short), what of the input they
    hold, else their text as it is."""
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if isinstance(value, dict) and isinstance(value.get(FREEFORM_INPUT), str):
        return value[FREEFORM_INPUT]
    return _input_so_far(arguments) if _INPUT_OPENING.match(arguments) else arguments


def _call(item_id_: str, call_id: str, called: str, arguments: str, status: ItemStatus,
          names: ToolNames) -> OutputFunctionCall | OutputCustomToolCall:
    """The output item of a call: a function_call, or a custom_tool_call with its input;
    a namespace's tool named apart from it."""
    name, namespace = names.split(called)
    call: OutputFunctionCall | OutputCustomToolCall
    if names.is_custom(called):
        call = OutputCustomToolCall(id=item_id_, call_id=call_id, name=name,
                                    input=custom_input(arguments), status=status)
    else:
        call = OutputFunctionCall(id=item_id_, call_id=call_id, name=name, arguments=arguments,
                                  status=status)
    if namespace is not None:
        call.namespace = namespace  # set, so sent (WireModel.omit_unset)
    return call


def output_items(parts: ChatMessageParts, incomplete: bool,
                 names: ToolNames = ToolNames()) -> list[OutputItem]:
    """The output items of a whole reply (its calls read back by the request's `names`)."""
    items: list[OutputItem] = []
    if parts.reasoning:
        items.append(OutputReasoning(id=item_id("rs"), status="completed",
                                     content=[ReasoningTextPart(text=parts.reasoning)]))
    if parts.content or not (items or parts.tool_calls):
        items.append(OutputMessage(id=item_id("msg"), status="completed",
                                   content=[OutputText(text=parts.content or "")]))
    items += [_call(item_id(_call_prefix(t.name, names)), t.id, t.name, t.arguments,
                    "completed", names) for t in parts.tool_calls]
    if incomplete:
        items[-1].status = "incomplete"
    return items


def _call_prefix(called: str, names: ToolNames) -> str:
    return "ctc" if names.is_custom(called) else "fc"


@dataclass
class _OpenItem:
    """The item a stream is writing: what kind, where, and its text so far (a call's
    arguments, for a call; of a custom tool's input, `sent` is what went out)."""

    kind: Literal["reasoning", "message", "function_call"]
    id: str
    output_index: int
    text: str = ""
    call_id: str = ""
    name: str = ""
    custom: bool = False
    sent: str = ""


class ResponseEventWriter:
    """The events of one streamed response, numbered from 0: `start()`, then `feed()` with
    each piece of the reading, then `finish()` (or `fail()`). Its items assemble to what
    output_items() gives for the whole text, since the reader's deltas assemble to its
    whole reading."""

    def __init__(self, response: ResponseObject, names: ToolNames = ToolNames()) -> None:
        """`response`: the response in progress (status in_progress, no output, no usage);
        `names`: the request's tool names, which its calls are read back by."""
        self._response = response
        self._names = names
        self._sequence = 0
        self._items: list[OutputItem] = []  # the items done
        self._open: _OpenItem | None = None

    def start(self) -> list[ResponseStreamEvent]:
        """response.created and response.in_progress."""
        return [self._lifecycle("response.created", self._response),
                self._lifecycle("response.in_progress", self._response)]

    def heartbeat(self) -> list[ResponseStreamEvent]:
        """response.in_progress again, for a stream that has been silent a while (a long
        prompt's prefill on a CPU takes minutes; Codex drops a stream silent for 5 minutes and
        only an event resets its clock, not an SSE comment). A lifecycle event every client
        already reads, changing nothing it builds."""
        return [self._lifecycle("response.in_progress", self._response)]

    def feed(self, parts: ChatDeltaParts) -> list[ResponseStreamEvent]:
        """The events of what one stream step read: reasoning, text, call pieces."""
        events: list[ResponseStreamEvent] = []
        if parts.reasoning:
            events += self._text("reasoning", parts.reasoning)
        if parts.content:
            events += self._text("message", parts.content)
        for call in parts.tool_calls:
            events += self._call(call)
        return events

    def finish(self, finish_reason: str | None,
               usage: ResponseUsage) -> list[ResponseStreamEvent]:
        """The last item's closing events, then response.completed (or response.incomplete)
        with the whole output and its usage."""
        status, details = response_status(finish_reason)
        events: list[ResponseStreamEvent] = []
        if self._open is None and not self._items:
            events += self._begin("message")  # a reply with nothing in it: an empty message
        events += self._close("incomplete" if status == "incomplete" else "completed")
        final = self._response.model_copy(update={
            "status": status, "incomplete_details": details, "output": self._items,
            "usage": usage})
        return [*events, self._lifecycle(f"response.{status}", final)]

    def fail(self, error: ResponseError) -> list[ResponseStreamEvent]:
        """The open item closed as incomplete, then response.failed with the error (the
        engine failed under this request, or died)."""
        events = self._close("incomplete")
        final = self._response.model_copy(update={"status": "failed", "error": error,
                                                  "output": self._items})
        return [*events, self._lifecycle("response.failed", final)]

    # -- items ----------------------------------------------------------------------------
    def _next(self) -> int:
        self._sequence += 1
        return self._sequence - 1

    def _lifecycle(self, kind: str, response: ResponseObject) -> ResponseLifecycleEvent:
        return ResponseLifecycleEvent(type=kind, sequence_number=self._next(), response=response)

    def _text(self, kind: Literal["reasoning", "message"], text: str) -> list[ResponseStreamEvent]:
        events: list[ResponseStreamEvent] = []
        if self._open is None or self._open.kind != kind:
            events += self._close("completed")
            events += self._begin(kind)
        item = self._open
        assert item is not None
        item.text += text
        delta = ReasoningTextDeltaEvent if kind == "reasoning" else OutputTextDeltaEvent
        events.append(delta(sequence_number=self._next(), item_id=item.id,
                            output_index=item.output_index, content_index=0, delta=text))
        return events

    def _call(self, call: ToolCallDelta) -> list[ResponseStreamEvent]:
        events: list[ResponseStreamEvent] = []
        if call.id is not None:  # a call's first piece (its id and name)
            events += self._close("completed")
            events += self._begin("function_call", call.id, call.name or "")
        item = self._open
        assert item is not None and item.kind == "function_call"
        if not call.arguments:
            return events
        item.text += call.arguments
        where = {"item_id": item.id, "output_index": item.output_index}
        if not item.custom:
            events.append(FunctionCallArgumentsDeltaEvent(
                sequence_number=self._next(), delta=call.arguments, **where))
            return events
        events += self._input_delta(item, _input_so_far(item.text))
        return events

    def _input_delta(self, item: _OpenItem, so_far: str) -> list[ResponseStreamEvent]:
        """A custom tool's input that `so_far` adds to what was sent (none if it adds
        nothing, or is not what was sent and more)."""
        if len(so_far) <= len(item.sent) or not so_far.startswith(item.sent):
            return []
        delta, item.sent = so_far[len(item.sent):], so_far
        return [CustomToolCallInputDeltaEvent(sequence_number=self._next(), item_id=item.id,
                                              output_index=item.output_index, delta=delta)]

    def _begin(self, kind: Literal["reasoning", "message", "function_call"], call_id: str = "",
               name: str = "") -> list[ResponseStreamEvent]:
        custom = kind == "function_call" and self._names.is_custom(name)
        prefix = {"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind]
        item = self._open = _OpenItem(kind, item_id("ctc" if custom else prefix),
                                      len(self._items), call_id=call_id, name=name,
                                      custom=custom)
        added = OutputItemEvent(type="response.output_item.added", sequence_number=self._next(),
                                output_index=item.output_index,
                                item=self._item(item, "in_progress", empty=True))
        if kind == "function_call":
            return [added]
        return [added, self._part("response.content_part.added", item, "")]

    def _close(self, status: ItemStatus) -> list[ResponseStreamEvent]:
        item, self._open = self._open, None
        if item is None:
            return []
        events: list[ResponseStreamEvent] = []
        where = {"item_id": item.id, "output_index": item.output_index}
        if item.custom:
            whole = custom_input(item.text)
            events += self._input_delta(item, whole)
            events.append(CustomToolCallInputDoneEvent(sequence_number=self._next(),
                                                       input=whole, **where))
        elif item.kind == "function_call":
            name = self._names.split(item.name)[0]
            events.append(FunctionCallArgumentsDoneEvent(
                sequence_number=self._next(), name=name, arguments=item.text, **where))
        else:
            done = ReasoningTextDoneEvent if item.kind == "reasoning" else OutputTextDoneEvent
            events.append(done(sequence_number=self._next(), content_index=0, text=item.text,
                               **where))
            events.append(self._part("response.content_part.done", item, item.text))
        whole = self._item(item, status)
        self._items.append(whole)
        events.append(OutputItemEvent(type="response.output_item.done",
                                      sequence_number=self._next(),
                                      output_index=item.output_index, item=whole))
        return events

    def _part(self, kind: str, item: _OpenItem, text: str) -> ContentPartEvent:
        part = ReasoningTextPart(text=text) if item.kind == "reasoning" else OutputText(text=text)
        return ContentPartEvent(type=kind, sequence_number=self._next(), item_id=item.id,
                                output_index=item.output_index, content_index=0, part=part)

    def _item(self, item: _OpenItem, status: ItemStatus, empty: bool = False) -> OutputItem:
        """The item as it stands: `empty` for its first event (no content yet)."""
        if item.kind == "function_call":
            return _call(item.id, item.call_id, item.name, "" if empty else item.text, status,
                         self._names)
        if item.kind == "reasoning":
            return OutputReasoning(id=item.id, status=status,
                                   content=[] if empty else [ReasoningTextPart(text=item.text)])
        return OutputMessage(id=item.id, status=status,
                             content=[] if empty else [OutputText(text=item.text)])
