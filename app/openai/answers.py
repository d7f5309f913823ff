"""What the OpenAI routes answer (pydantic): completions, chat completions, their stream chunks,
the model list, vLLM's (de)tokenize answers and the error body. The routes build these;
/openapi.json shows them.

OpenAI's fields, in OpenAI's order, and officellm's (vLLM's) additions: `stop_reason` on each
choice (the stop string or token id that ended it, else null) and `root`/`max_model_len` on a
model card. A field OpenAI sends as null is null here too; the few it leaves out of some
messages (a delta's role, a stream's usage without include_usage) are `WireModel.omit_unset`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from officellm.app.errors import APIError


class WireModel(BaseModel):
    """A JSON object whose fields named in `omit_unset` are left out unless the code that built
    it set them (to a value, or to None for an explicit null). Every other field is always
    sent, null included."""

    omit_unset: ClassVar[frozenset[str]] = frozenset()

    # No return annotation: with one, pydantic would take it for the answer's schema.
    @model_serializer(mode="wrap")
    def _leave_out_unset(self, handler: SerializerFunctionWrapHandler):  # noqa: ANN202
        data = handler(self)
        if self.omit_unset and isinstance(data, dict):
            for name in self.omit_unset - self.model_fields_set:
                data.pop(name, None)
        return data

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema,
                                     handler: Any) -> JsonSchemaValue:
        # Always-sent fields are required in the answer's schema; the omitted ones are not.
        json_schema = handler(schema)
        target = handler.resolve_ref_schema(json_schema)
        if handler.mode == "serialization" and "properties" in target:
            required = [name for name in target["properties"]
                        if name not in cls._omitted_aliases()]
            if required:
                target["required"] = required
            else:
                target.pop("required", None)
        return json_schema

    @classmethod
    def _omitted_aliases(cls) -> set[str]:
        return {cls.model_fields[n].alias or n for n in cls.omit_unset}


# "stop" (EOS, a stop string or token), "length" (max_tokens or the context), "abort"; null
# while a streamed choice runs. Not an enum: the engine's reasons are the engine's to add.
FinishReason = str
StopReason = int | str | None  # the stop token id or the stop string that ended a choice


class Usage(WireModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


# -- logprobs ------------------------------------------------------------------------------

class TopLogprob(WireModel):
    token: str
    logprob: float
    bytes: list[int] = Field(description="The token's UTF-8 bytes (part of a character, maybe).")


class ChatTokenLogprob(WireModel):
    token: str
    logprob: float | None
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(WireModel):
    content: list[ChatTokenLogprob]


class CompletionLogprobs(WireModel):
    """Per token; with echo the prompt's tokens come first, the first of them with null
    token_logprobs and top_logprobs (nothing comes before it)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


# -- chat ----------------------------------------------------------------------------------

class FunctionCall(WireModel):
    name: str
    arguments: str  # JSON text of the arguments object


class ToolCall(WireModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(WireModel):
    """The reply; `tool_calls` and the reasoning fields (vLLM's `reasoning_content` and its
    newer `reasoning`, the same text) only when there are some."""

    omit_unset = frozenset({"tool_calls", "reasoning_content", "reasoning"})
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class ChatChoice(WireModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None
    stop_reason: StopReason = None


class ChatCompletion(WireModel):
    """POST /v1/chat/completions without `stream`."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class FunctionCallDelta(WireModel):
    omit_unset = frozenset({"name", "arguments"})
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(WireModel):
    """A piece of a streamed tool call: id, type and name in its first piece only."""

    omit_unset = frozenset({"id", "type"})
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class ChatDelta(WireModel):
    """What a chunk adds to a choice: the role (first chunk only), text, reasoning text,
    tool-call pieces."""

    omit_unset = frozenset({"role", "content", "tool_calls", "reasoning_content", "reasoning"})
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class ChatChunkChoice(WireModel):
    # OpenAI's first chunk (the role) has no stop_reason; the others carry it.
    omit_unset = frozenset({"stop_reason"})
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None
    stop_reason: StopReason = None


class ChatCompletionChunk(WireModel):
    """One `data:` event of a streamed chat completion. `usage` is there only with
    stream_options.include_usage: null on each chunk, the totals on the last (no choices)."""

    omit_unset = frozenset({"usage"})
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


# -- completions ---------------------------------------------------------------------------

class CompletionChoice(WireModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None
    stop_reason: StopReason = None


class Completion(WireModel):
    """POST /v1/completions without `stream`."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunk(WireModel):
    """One `data:` event of a streamed completion (`usage` as in ChatCompletionChunk)."""

    omit_unset = frozenset({"usage"})
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


# -- vLLM's /tokenize and /detokenize ------------------------------------------------------

class TokenizeResponse(WireModel):
    """POST /tokenize: the prompt's token ids, their count and the model's context length."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = Field(
        None, description="Each token's string, with `return_token_strs`; else null.")


class DetokenizeResponse(WireModel):
    """POST /detokenize: the text of the token ids."""

    prompt: str


# -- models and errors ---------------------------------------------------------------------

class ModelCard(WireModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "officellm"
    root: str | None = Field(description="The model's directory on the server.")
    max_model_len: int | None
    state: str = Field("ready", description=(
        "officellm's: ready; loading; sleeping (--sleep-idle-seconds: its memory freed) or "
        "unloaded (not loaded yet, or unloaded to make room): the next request loads it and "
        "waits for it; failed (its last load failed: the next request tries again)."))


class ModelList(WireModel):
    """GET /v1/models: every served model under each of its names."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(WireModel):
    """OpenAI's error object. `detail` (the message again) is sent only to front-end keys:
    Open WebUI shows an error object's `detail`, and without one its chat window reads
    "Server connection failed" instead of the sentence (app/errors.py)."""

    omit_unset: ClassVar[frozenset[str]] = frozenset({"detail"})

    message: str
    type: str
    param: str | None
    code: str | None
    detail: str | None = None


class ErrorResponse(WireModel):
    """Every error, in OpenAI's shape (also the last event of a stream that fails)."""

    error: ErrorDetail


def error_response(error: APIError) -> ErrorResponse:
    """The error as its protocol model: the last event of a stream that fails."""
    return ErrorResponse.model_validate(error.body())


# For a router's `responses=`: every 4xx and 5xx is an ErrorResponse (never FastAPI's 422).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorResponse, "description": "A client error, in OpenAI's shape"},
    "5XX": {"model": ErrorResponse, "description": "A server error, in OpenAI's shape"},
}


def sse_description(chunk: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """The 200 answer of a route that streams when asked: JSON, or with `stream: true` a
    text/event-stream of `data: <chunk JSON>` events ending `data: [DONE]`."""
    return {200: {"description": f"The answer; with `stream: true`, server-sent events: "
                                 f"`data: <{chunk.__name__}>` each, then `data: [DONE]`",
                  "content": {"text/event-stream": {"schema": {"type": "string"}}}}}
