"""What POST /v1/responses answers (pydantic): the response object, its output items and
usage, and the events of its stream, in the shapes of OpenAI's Responses API (the `openai`
package's types/responses are the reference). app/openai/routes/responses.py builds these;
/openapi.json shows them. (app/openai/answers.py holds chat and completions' answers.)

A response echoes the request's settings as OpenAI's does (instructions, tools, tool_choice,
text, temperature, ...). `store` is always false and `previous_response_id` null: this server
stores nothing.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field

from officellm.app.openai.answers import WireModel

ItemStatus = Literal["in_progress", "completed", "incomplete"]
ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed"]


# -- output items -------------------------------------------------------------------------

class OutputText(WireModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list, description="Always empty here.")


class OutputMessage(WireModel):
    """The model's answer text."""

    type: Literal["message"] = "message"
    id: str
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class OutputFunctionCall(WireModel):
    """A call of one of the request's function tools, for the client to run; its result
    goes back as a function_call_output input item with the same `call_id`."""

    omit_unset: ClassVar[frozenset[str]] = frozenset({"namespace"})

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str = Field(description="JSON text of the arguments object.")
    status: ItemStatus
    namespace: str | None = Field(None, description="A namespace tool's function: its "
                                                    "namespace (sent only then).")


class OutputCustomToolCall(WireModel):
    """A call of one of the request's custom (freeform) tools, with its raw input; its
    result goes back as a custom_tool_call_output input item with the same `call_id`."""

    omit_unset: ClassVar[frozenset[str]] = frozenset({"namespace"})

    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str
    call_id: str
    name: str
    input: str
    status: ItemStatus
    namespace: str | None = Field(None, description="A namespace's tool: its namespace (sent "
                                                    "only then).")


class ReasoningTextPart(WireModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputReasoning(WireModel):
    """A reasoning model's thinking, before its answer (with --reasoning-parser)."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list, description="Always empty here.")
    content: list[ReasoningTextPart]
    status: ItemStatus


OutputItem = Annotated[OutputMessage | OutputFunctionCall | OutputCustomToolCall
                       | OutputReasoning, Field(discriminator="type")]


# -- the response -------------------------------------------------------------------------

class InputTokensDetails(WireModel):
    cached_tokens: int = Field(description="Prompt tokens the prefix cache already held.")


class OutputTokensDetails(WireModel):
    reasoning_tokens: int = Field(
        description="Always 0 here: reasoning tokens are counted in output_tokens only.")


class ResponseUsage(WireModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(WireModel):
    reason: Literal["max_output_tokens"] | None = Field(
        description="max_output_tokens (or the context) cut the output; null if it was "
                    "aborted.")


class ResponseError(WireModel):
    code: str
    message: str


class FunctionToolEcho(WireModel):
    type: Literal["function"] = "function"
    name: str
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool | None


class CustomToolFormatEcho(WireModel):
    type: Literal["text", "grammar"]
    syntax: Literal["lark", "regex"] | None = None
    definition: str | None = None


class CustomToolEcho(WireModel):
    type: Literal["custom"] = "custom"
    name: str
    description: str | None
    format: CustomToolFormatEcho


class NamespaceToolEcho(WireModel):
    type: Literal["namespace"] = "namespace"
    name: str
    description: str | None
    tools: list[FunctionToolEcho | CustomToolEcho]


class NamedToolChoiceEcho(WireModel):
    type: Literal["function", "custom"] = "function"
    name: str


class PlainTextFormat(WireModel):
    type: Literal["text", "json_object"]


class JSONSchemaTextFormat(WireModel):
    # `schema` would shadow BaseModel.schema(): an alias, used when serializing.
    model_config = ConfigDict(serialize_by_alias=True, populate_by_name=True)

    type: Literal["json_schema"] = "json_schema"
    name: str
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None
    strict: bool | None


class TextConfigEcho(WireModel):
    format: PlainTextFormat | JSONSchemaTextFormat
    verbosity: str | None


class ReasoningEcho(WireModel):
    effort: str | None
    summary: str | None


class ResponseObject(WireModel):
    """POST /v1/responses without `stream`; in a stream, the response of its lifecycle
    events (in progress, then completed, incomplete or failed)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: None = None
    reasoning: ReasoningEcho
    store: Literal[False] = False
    background: Literal[False] = False
    temperature: float
    text: TextConfigEcho
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoiceEcho
    tools: list[FunctionToolEcho | CustomToolEcho | NamespaceToolEcho]
    top_p: float
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None
    metadata: dict[str, str]


# -- stream events ------------------------------------------------------------------------

class _Event(WireModel):
    # Declared here so that `type` comes first on the wire, as OpenAI sends it; each event
    # narrows it.
    type: str
    sequence_number: int


class ResponseLifecycleEvent(_Event):
    type: Literal["response.created", "response.in_progress", "response.completed",
                  "response.incomplete", "response.failed"]
    response: ResponseObject


class OutputItemEvent(_Event):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


class ContentPartEvent(_Event):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int
    content_index: int
    part: Annotated[OutputText | ReasoningTextPart, Field(discriminator="type")]


class OutputTextDeltaEvent(_Event):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = Field(default_factory=list, description="Always empty here.")


class OutputTextDoneEvent(_Event):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = Field(default_factory=list, description="Always empty here.")


class ReasoningTextDeltaEvent(_Event):
    type: Literal["response.reasoning_text.delta"] = "response.reasoning_text.delta"
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningTextDoneEvent(_Event):
    type: Literal["response.reasoning_text.done"] = "response.reasoning_text.done"
    item_id: str
    output_index: int
    content_index: int
    text: str


class FunctionCallArgumentsDeltaEvent(_Event):
    type: Literal["response.function_call_arguments.delta"] = \
        "response.function_call_arguments.delta"
    item_id: str
    output_index: int
    delta: str


class FunctionCallArgumentsDoneEvent(_Event):
    type: Literal["response.function_call_arguments.done"] = \
        "response.function_call_arguments.done"
    item_id: str
    output_index: int
    name: str
    arguments: str


class CustomToolCallInputDeltaEvent(_Event):
    type: Literal["response.custom_tool_call_input.delta"] = \
        "response.custom_tool_call_input.delta"
    item_id: str
    output_index: int
    delta: str


class CustomToolCallInputDoneEvent(_Event):
    type: Literal["response.custom_tool_call_input.done"] = \
        "response.custom_tool_call_input.done"
    item_id: str
    output_index: int
    input: str


ResponseStreamEvent = (ResponseLifecycleEvent | OutputItemEvent | ContentPartEvent
                       | OutputTextDeltaEvent | OutputTextDoneEvent | ReasoningTextDeltaEvent
                       | ReasoningTextDoneEvent | FunctionCallArgumentsDeltaEvent
                       | FunctionCallArgumentsDoneEvent | CustomToolCallInputDeltaEvent
                       | CustomToolCallInputDoneEvent)


def event_stream_description() -> dict[int | str, dict[str, Any]]:
    """The 200 answer of POST /v1/responses: JSON, or with `stream: true` a
    text/event-stream of `event: <type>` / `data: <event JSON>` pairs."""
    return {200: {"description": "The response; with `stream: true`, server-sent events, each "
                                 "`event: <type>` then `data: <the event, with its type and "
                                 "sequence_number>`: response.created, response.in_progress, "
                                 "the output items' events, then response.completed (or "
                                 "response.incomplete, response.failed). No `[DONE]`.",
                  "content": {"text/event-stream": {"schema": {"type": "string"}}}}}
