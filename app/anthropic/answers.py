"""What the Anthropic routes answer (pydantic): the message object, the events of its stream,
count_tokens' count, and the error body, in Anthropic's shapes (the `anthropic` client parses
them in tests/server/test_anthropic_api.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use",
                     "model_context_window_exceeded"]


class Usage(BaseModel):
    """Anthropic's split of the prompt: `input_tokens` are those the engine computed,
    `cache_read_input_tokens` those it found in its prefix cache (their sum is the prompt).
    Nothing is written to a cache on request here, so cache_creation_input_tokens is 0."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class TextOut(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingOut(BaseModel):
    """The model's thinking. `signature` is Anthropic's proof that thinking came from its
    model; there is none to give here, so it is empty (clients send it back unread)."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""


class ToolUseOut(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


OutBlock = TextOut | ThinkingOut | ToolUseOut


class MessageObject(BaseModel):
    """The answer of POST /v1/messages (and, empty, the message of `message_start`)."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[OutBlock]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: Usage


class CountTokensResponse(BaseModel):
    input_tokens: int


# -- stream events ------------------------------------------------------------------------

class MessageStart(BaseModel):
    type: Literal["message_start"] = "message_start"
    message: MessageObject


class ContentBlockStart(BaseModel):
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: OutBlock


class TextDelta(BaseModel):
    type: Literal["text_delta"] = "text_delta"
    text: str


class ThinkingDelta(BaseModel):
    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str


class SignatureDelta(BaseModel):
    type: Literal["signature_delta"] = "signature_delta"
    signature: str


class InputJSONDelta(BaseModel):
    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


class ContentBlockDelta(BaseModel):
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: TextDelta | ThinkingDelta | SignatureDelta | InputJSONDelta


class ContentBlockStop(BaseModel):
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class StopDetails(BaseModel):
    stop_reason: StopReason | None
    stop_sequence: str | None = None


class MessageDelta(BaseModel):
    """The end of the message: why it stopped, and the whole usage (Anthropic's
    message_delta carries output_tokens, and the prompt's counts again)."""

    type: Literal["message_delta"] = "message_delta"
    delta: StopDetails
    usage: Usage


class MessageStop(BaseModel):
    type: Literal["message_stop"] = "message_stop"


class Ping(BaseModel):
    """Said while the message waits for its first token (app/serving/heartbeats.py)."""

    type: Literal["ping"] = "ping"


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorEvent(BaseModel):
    """An error: the body of an error answer, or the last event of a stream that failed."""

    type: Literal["error"] = "error"
    error: ErrorDetail


StreamEvent = (MessageStart | ContentBlockStart | ContentBlockDelta | ContentBlockStop
               | MessageDelta | MessageStop | Ping | ErrorEvent)
