"""POST /v1/responses: OpenAI's Responses API request (pydantic), and its translation into what
the chat pipeline runs: template messages, a ToolRequest, an output Constraint, SamplingParams.

Stateless: this server stores nothing (no response, no conversation, no message content), so
the fields that point at stored state (previous_response_id, conversation, a stored prompt,
item_reference inputs) and background runs are refused with a 400 that says to send the whole
conversation in `input`. `store` is accepted, true or false (OpenAI's clients send true by
default), and nothing is stored either way.

As on the chat route (app/openai/protocol.py): unknown fields are ignored, and a known field
that changes the output is honoured or refused with a 400 that says so. The hints OpenAI's
own models take are echoed; `reasoning.effort` also reaches the chat template as its
`reasoning_effort` (gpt-oss's), `text.verbosity` is not acted on. The sampling fields' ranges are SamplingParams' (checked when
sampling_params() builds it, shown in the JSON schema); max_output_tokens is its max_tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    Tag,
    field_validator,
    model_validator,
)

from officellm.app.chat.image_parts import image_part, part_content, text_part
from officellm.app.chat.output_constraint import (
    Constraint,
    JSONSchemaFormat,
    ResponseFormat,
    format_constraint,
)
from officellm.app.chat.reasoning_effort import effort_kwargs
from officellm.app.chat.tools import (
    FREEFORM_INPUT,
    ChatTool,
    FreeformCall,
    FunctionDefinition,
    NamedFunction,
    NamedToolChoice,
    ToolRequest,
    freeform_parameters,
    template_message,
)
from officellm.app.openai.protocol import bounded
from officellm.engine import SamplingParams, SamplingParamsError, StructuredOutputsParams

Message = dict[str, Any]

NO_TRANSCRIPTS = ("this server keeps no transcripts (message content is never stored); send "
                  "the whole conversation in input.")
# SamplingParams' field -> the request's, where they differ (for a 400's `param`).
_SAMPLING_NAMES = {"max_tokens": "max_output_tokens"}
# `include` asks for extra output; of what OpenAI can include, only logprobs would come from
# this server, and it does not return them. The rest (reasoning.encrypted_content, which
# Codex sends, and the hosted tools' results) is about output this server never makes.
_UNSUPPORTED_INCLUDES = frozenset({"message.output_text.logprobs"})
# Between a namespace's name and its function's, in the name the model sees and calls.
NAMESPACE_SEPARATOR = "."


@dataclass(frozen=True)
class ToolNames:
    """How the names the model calls map back to a request's tools: `namespace.name` to a
    namespace's tool, and which called names are custom (freeform) tools."""

    namespaces: frozenset[str] = frozenset()
    custom: frozenset[str] = frozenset()

    def split(self, called: str) -> tuple[str, str | None]:
        """A called `namespace.name` as (name, namespace) when `namespace` is one of the
        request's namespaces, else (called, None)."""
        namespace, sep, name = called.partition(NAMESPACE_SEPARATOR)
        if sep and name and namespace in self.namespaces:
            return name, namespace
        return called, None

    def is_custom(self, called: str) -> bool:
        return called in self.custom


class UnsupportedField(ValueError):
    """A request field this stateless server cannot honour; `param` names it (a 400)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


# -- input items --------------------------------------------------------------------------

def _called_name(name: str, namespace: str | None) -> str:
    """The name the model sees and calls a tool by: `namespace.name` inside a namespace."""
    return name if namespace is None else f"{namespace}{NAMESPACE_SEPARATOR}{name}"


class TextPart(BaseModel):
    """A text content part: input_text (what the client writes) or output_text (an earlier
    answer, sent back)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["input_text", "output_text"]
    text: str

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") not in (None, "input_text", "output_text"):
            raise ValueError(f"Content part type {data['type']!r} is not supported: send "
                             "input_text, input_image and output_text parts.")
        return data


class ImagePart(BaseModel):
    """An input_image part: `image_url` a data URI or an http(s) URL; `detail` is accepted
    and changes nothing (the model's own processor decides the resolution). `file_id` is
    refused: this server has no files API."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None

    @model_validator(mode="after")
    def _by_url(self) -> ImagePart:
        if self.image_url is None:
            if self.file_id is not None:
                raise ValueError("An input_image's file_id is not supported: this server has "
                                 "no files API; send image_url (a data URI or an http(s) URL).")
            raise ValueError("An input_image part needs image_url (a data URI or an http(s) "
                             "URL).")
        return self

    def template_part(self) -> dict[str, Any]:
        assert self.image_url is not None  # _by_url
        return image_part(self.image_url)


def _text_or_list(tags: tuple[str, str]) -> Discriminator:
    """Tell a text from a list by its type (the other branch's errors would only confuse)."""
    text, items = tags
    return Discriminator(lambda value: text if isinstance(value, str) else items)


# A message's content or a call's output: a text, or text parts.
TextContent = Annotated[
    Annotated[str, Tag("ContentText")] | Annotated[list[TextPart], Tag("ContentParts")],
    _text_or_list(("ContentText", "ContentParts")),
]


def _text(content: str | list[TextPart]) -> str:
    # Parts joined by newlines, as the chat route joins a message's text parts.
    return content if isinstance(content, str) else "\n".join(p.text for p in content)


def _part_tag(part: Any) -> str:
    if isinstance(part, dict):
        return "ImagePart" if part.get("type") == "input_image" else "TextPart"
    return type(part).__name__


# A message's content part: a text or an image.
MessagePart = Annotated[
    Annotated[TextPart, Tag("TextPart")] | Annotated[ImagePart, Tag("ImagePart")],
    Discriminator(_part_tag),
]
# A message's content: a text, or text and image parts.
MessageContent = Annotated[
    Annotated[str, Tag("ContentText")] | Annotated[list[MessagePart], Tag("ContentParts")],
    _text_or_list(("ContentText", "ContentParts")),
]


def _message_content(content: str | list[TextPart | ImagePart]) -> str | list[dict[str, Any]]:
    """A message's content for the template: one text (parts joined by newlines, as the
    chat route joins them), or with an image among them, the parts
    (app/chat/image_parts.py)."""
    if isinstance(content, str):
        return content
    return part_content([p.template_part() if isinstance(p, ImagePart) else text_part(p.text)
                         for p in content], "\n")


class MessageItem(BaseModel):
    """A message: the client's (user, system, developer) or an earlier answer (assistant).
    `type` may be left out, as OpenAI allows for `{"role", "content"}`."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: MessageContent


class FunctionCallItem(BaseModel):
    """A call the model made in an earlier turn, sent back before its result."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # JSON text of the arguments object
    namespace: str | None = None  # a namespace tool's function: its namespace

    @property
    def called_name(self) -> str:
        """The name the model called it by (`namespace.name` inside a namespace)."""
        return _called_name(self.name, self.namespace)


class FunctionCallOutputItem(BaseModel):
    """The result of a call, by the call's `call_id`."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call_output"]
    call_id: str
    output: TextContent


class CustomToolCallItem(BaseModel):
    """A call of a custom (freeform) tool in an earlier turn: its raw `input`."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    namespace: str | None = None

    @property
    def called_name(self) -> str:
        return _called_name(self.name, self.namespace)


class CustomToolCallOutputItem(BaseModel):
    """The result of a custom tool's call, by the call's `call_id`."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["custom_tool_call_output"]
    call_id: str
    output: TextContent


class ReasoningText(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(BaseModel):
    """An earlier answer's reasoning, sent back: its text goes to the next assistant message
    as `reasoning_content`, which reasoning models' templates render or drop as they do in
    chat (a summary is not the reasoning, and is left out)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["reasoning"]
    content: list[ReasoningText] | None = None


_ITEM_TYPES = {"message": MessageItem, "function_call": FunctionCallItem,
               "function_call_output": FunctionCallOutputItem, "reasoning": ReasoningItem,
               "custom_tool_call": CustomToolCallItem,
               "custom_tool_call_output": CustomToolCallOutputItem}


def _item_type(item: Any) -> str | None:
    """An input item's union tag (its model's name), by its `type` (a message may leave it
    out); None for what is no item at all (a 400)."""
    if isinstance(item, dict):
        kind = item.get("type", "message")
        model = _ITEM_TYPES.get(kind) if isinstance(kind, str) else None
        return model.__name__ if model is not None else None
    return type(item).__name__ if isinstance(item, tuple(_ITEM_TYPES.values())) else None


InputItem = Annotated[
    Annotated[MessageItem, Tag("MessageItem")]
    | Annotated[FunctionCallItem, Tag("FunctionCallItem")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutputItem")]
    | Annotated[ReasoningItem, Tag("ReasoningItem")]
    | Annotated[CustomToolCallItem, Tag("CustomToolCallItem")]
    | Annotated[CustomToolCallOutputItem, Tag("CustomToolCallOutputItem")],
    Discriminator(_item_type, custom_error_type="input_item",
                  custom_error_message="Each input item is an object: a message "
                                       "({role, content}), a function_call, a "
                                       "function_call_output, a custom_tool_call, a "
                                       "custom_tool_call_output or a reasoning item."),
]
Input = Annotated[
    Annotated[str, Tag("InputText")]
    | Annotated[list[InputItem], Tag("InputItems"), Field(min_length=1)],
    _text_or_list(("InputText", "InputItems")),
]
# Pydantic puts these tags in the path of an error inside their branch: no field of the
# request, so app/error_handlers.py leaves them out of `param`.
UNION_TAGS = frozenset({"ContentText", "ContentParts", "InputText", "InputItems",
                        "TextPart", "ImagePart",
                        *(model.__name__ for model in _ITEM_TYPES.values())})


# -- tools, tool_choice, text -------------------------------------------------------------

class FunctionTool(FunctionDefinition):
    """A function tool in the Responses API's flat shape: {"type": "function", "name",
    "description", "parameters", "strict"}. The client runs it."""

    type: Literal["function"]
    parameters: dict[str, Any] | None = None

    def chat_tool(self, namespace: str | None = None) -> ChatTool:
        """The same function as a chat completions tool (named `namespace.name` inside a
        namespace, so the model tells it from a tool of the same name elsewhere)."""
        fields = self.model_dump(exclude={"type"}, exclude_none=True)
        if namespace is not None:
            fields["name"] = f"{namespace}{NAMESPACE_SEPARATOR}{self.name}"
        return ChatTool(type="function", function=FunctionDefinition(**fields))


class CustomToolFormat(BaseModel):
    """A custom tool's input: free text, or text in a grammar (Lark or a regular
    expression), which xgrammar constrains."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "grammar"] = "text"
    syntax: Literal["lark", "regex"] | None = None
    definition: str | None = None

    @model_validator(mode="after")
    def _grammar_given(self) -> CustomToolFormat:
        if self.type == "grammar" and not (self.syntax and self.definition):
            raise ValueError("A custom tool's format of type grammar needs its syntax (lark "
                             "or regex) and its definition.")
        return self

    def grammar(self) -> StructuredOutputsParams | None:
        """The constraint on the input (None for free text)."""
        if self.type == "text":
            return None
        if self.syntax == "regex":
            return StructuredOutputsParams(regex=self.definition)
        return StructuredOutputsParams(lark=self.definition)

    def sentence(self) -> str:
        """What the model is told of the input."""
        if self.type == "text":
            return "Its input is free text."
        return f"Its input is text in this {self.syntax} grammar:\n{self.definition}"


class CustomTool(BaseModel):
    """A freeform tool (Codex's `apply_patch`): called with raw text, not JSON. The model
    sees a function of one string, `input`, described with the format; called of the
    model's accord (auto, required), the grammar is that description; named in tool_choice,
    the whole answer is the input and the grammar constrains it (docs/clients.md)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["custom"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")
    description: str | None = None
    format: CustomToolFormat = Field(default_factory=CustomToolFormat)

    def _description(self) -> str:
        return "\n".join(t for t in (self.description, self.format.sentence()) if t)

    def chat_tool(self, namespace: str | None = None) -> ChatTool:
        """The tool as a function of one string argument, `input`."""
        return ChatTool(type="function", function=FunctionDefinition(
            name=_called_name(self.name, namespace), description=self._description(),
            parameters=freeform_parameters(f"The input of {self.name}, as raw text.")))

    def forced_call(self, namespace: str | None = None) -> FreeformCall:
        """A call of this tool as the whole answer (tool_choice naming it)."""
        name = _called_name(self.name, namespace)
        text = (f"Answer with the input of the tool {name} and nothing else: no explanation, "
                f"no quotes, no JSON around it. {self._description()}")
        return FreeformCall(name, text, self.format.grammar())


NamespacedTool = Annotated[FunctionTool | CustomTool, Field(discriminator="type")]


class NamespaceTool(BaseModel):
    """Tools grouped under a name (Codex's `multi_agent_v1`): the model sees each as
    `namespace.name`; its calls come back as items naming the tool and its namespace apart,
    as OpenAI's do."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["namespace"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")
    description: str | None = None
    tools: list[NamespacedTool]

    def chat_tools(self) -> list[ChatTool]:
        return [t.chat_tool(self.name) for t in self.tools]


# Tools OpenAI runs on its side (or a client runs with a schema only OpenAI's models know):
# this server cannot run them, and clients send them as optional extras (Codex sends
# web_search with every request), so a request carrying them is served without them, with
# one log line (app/openai/routes/responses.py) and a word in docs/clients.md.
# `tool_search` (Codex sends it for OpenAI's newest models) finds tools marked
# `defer_loading`, which OpenAI hides from its model until found; here every tool is shown
# from the start, so there is nothing to find.
HOSTED_TOOL_TYPES = frozenset({
    "web_search", "web_search_preview", "web_search_2025_08_26",
    "web_search_preview_2025_03_11", "file_search", "code_interpreter", "image_generation",
    "computer_use_preview", "computer_use", "mcp", "local_shell", "shell", "apply_patch",
    "tool_search"})


_TOOL_TYPES = {"function": FunctionTool, "custom": CustomTool, "namespace": NamespaceTool}


def _tool_type(tool: Any) -> str | None:
    if isinstance(tool, dict):
        model = _TOOL_TYPES.get(tool.get("type", "function"))
        return model.__name__ if model is not None else None
    return type(tool).__name__ if isinstance(tool, tuple(_TOOL_TYPES.values())) else None


ResponsesTool = Annotated[
    Annotated[FunctionTool, Tag("FunctionTool")] | Annotated[CustomTool, Tag("CustomTool")]
    | Annotated[NamespaceTool, Tag("NamespaceTool")],
    Discriminator(_tool_type, custom_error_type="tool",
                  custom_error_message="Each tool is an object: a function tool, a custom "
                                       "tool or a namespace of them."),
]


class FunctionToolChoice(BaseModel):
    """tool_choice naming one function: {"type": "function", "name": ...}."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    name: str


class CustomToolChoice(BaseModel):
    """tool_choice naming one custom tool: {"type": "custom", "name": ...}."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["custom"]
    name: str


ResponsesToolChoice = (Literal["none", "auto", "required"]
                       | Annotated[FunctionToolChoice | CustomToolChoice,
                                   Field(discriminator="type")])


class TextFormat(JSONSchemaFormat):
    """text.format: {"type": "text"} (the default), {"type": "json_object"}, or a JSON
    schema in the Responses API's flat shape {"type": "json_schema", "name", "schema",
    "strict"} (the grammar always enforces the schema, strict or not)."""

    type: Literal["text", "json_object", "json_schema"] = "text"

    @model_validator(mode="after")
    def _schema_given(self) -> TextFormat:
        if self.type == "json_schema" and not self.schema_:
            raise ValueError("text.format of type json_schema needs a schema.")
        return self

    def response_format(self) -> ResponseFormat:
        """The same format as chat completions' response_format."""
        return ResponseFormat(type=self.type,
                              json_schema=self if self.type == "json_schema" else None)


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: TextFormat = Field(default_factory=TextFormat)
    verbosity: Literal["low", "medium", "high"] | None = None  # a hint: echoed, not acted on


class ReasoningConfig(BaseModel):
    """OpenAI's reasoning options: the effort becomes the template's reasoning_effort
    (app/chat/reasoning_effort.py; gpt-oss's template takes it), the summary is echoed."""

    model_config = ConfigDict(extra="ignore")

    effort: str | None = None
    summary: str | None = None


# -- the request --------------------------------------------------------------------------

class ResponsesRequest(BaseModel):
    """POST /v1/responses."""

    # NaN and Infinity parse as JSON numbers in Python; no sampling field means anything by them.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str | None = None
    input: Input
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: ResponsesToolChoice | None = None  # None: "auto"
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(None, json_schema_extra=bounded("max_tokens"))
    # OpenAI's own ceiling (SamplingParams only needs temperature >= 0).
    temperature: float | None = Field(None, le=2.0, json_schema_extra=bounded("temperature"))
    top_p: float | None = Field(None, json_schema_extra=bounded("top_p"))
    stream: bool = False
    reasoning: ReasoningConfig | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    include: list[str] | None = None
    # Accepted either way; nothing is stored (the module's docstring).
    store: bool | None = None
    # Refused when set (check_supported): each needs state this server does not keep.
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    _skipped_tools: list[str] = PrivateAttr(default_factory=list)  # _skip_hosted_tools
    @field_validator("input", mode="before")
    @classmethod
    def _known_items(cls, value: Any) -> Any:
        if isinstance(value, list):
            for i, item in enumerate(value):
                kind = item.get("type", "message") if isinstance(item, dict) else None
                if kind == "item_reference":
                    raise ValueError(f"Input item type 'item_reference' (item {i}) is not "
                                     f"supported: {NO_TRANSCRIPTS}")
                if isinstance(kind, str) and kind not in _ITEM_TYPES:
                    raise ValueError(f"Input item type {kind!r} (item {i}) is not supported: "
                                     f"send {', '.join(_ITEM_TYPES)} items.")
        return value

    @model_validator(mode="wrap")
    @classmethod
    def _skip_hosted_tools(cls, data: Any, handler: ModelWrapValidatorHandler[ResponsesRequest]
                           ) -> ResponsesRequest:
        """Hosted tools leave `tools` for `skipped_tools` (they are optional extras this server
        cannot run); any other type but function and namespace is a 400 naming it."""
        if not isinstance(data, dict) or not isinstance(data.get("tools"), list):
            return handler(data)
        kept, skipped = [], []
        for i, tool in enumerate(data["tools"]):
            kind = tool.get("type", "function") if isinstance(tool, dict) else None
            if kind in HOSTED_TOOL_TYPES:
                skipped.append(kind)
            elif isinstance(kind, str) and kind not in _TOOL_TYPES:
                raise ValueError(f"Tool type {kind!r} (tools.{i}) is not supported: give "
                                 "function or custom tools (or namespaces of them), which "
                                 "the client runs.")
            else:
                kept.append(tool)
        request = handler({**data, "tools": kept})
        request._skipped_tools = skipped
        return request

    @property
    def skipped_tools(self) -> list[str]:
        """The types of the hosted tools the request carried, left out."""
        return self._skipped_tools

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _function_choice(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("type") not in ("function", "custom"):
            raise ValueError(f"tool_choice of type {value.get('type')!r} is not supported; use "
                             "'none', 'auto', 'required', {'type': 'function', 'name': ...} "
                             "or {'type': 'custom', 'name': ...}.")
        return value

    def check_supported(self) -> None:
        """UnsupportedField (a 400 naming the field) for what this stateless server cannot
        do: continue a stored response or conversation, use a stored prompt, run in the
        background, cut a long input itself, return logprobs."""
        if self.previous_response_id is not None:
            raise UnsupportedField("previous_response_id",
                                   f"previous_response_id is not supported: {NO_TRANSCRIPTS}")
        if self.conversation is not None:
            raise UnsupportedField("conversation", f"conversation is not supported: {NO_TRANSCRIPTS}")
        if self.prompt is not None:
            raise UnsupportedField("prompt", "prompt (a stored prompt template) is not supported: "
                                             "this server stores none; send the instructions "
                                             "and input themselves.")
        if self.background:
            raise UnsupportedField("background", "background is not supported: this server stores "
                                                 "no responses to fetch later; send the request "
                                                 "without it (stream: true to see it progress).")
        if self.truncation == "auto":
            raise UnsupportedField("truncation", "truncation 'auto' is not supported: an input "
                                                 "longer than the context is refused, not cut; "
                                                 "leave out old items yourself.")
        asked = sorted(_UNSUPPORTED_INCLUDES & set(self.include or []))
        if asked:
            raise UnsupportedField("include", f"include {asked[0]!r} is not supported: this "
                                              "server does not return logprobs here.")

    def messages(self) -> list[Message]:
        """The conversation as chat-template messages: `instructions` as a system message
        first, then the input's items in order; an earlier turn's function_call items join
        the assistant message before them (one turn: its text, then its calls; a custom
        tool's call with its input as the `input` argument), each function_call_output and
        custom_tool_call_output is a `tool` message. ValueError (a 400) for a call whose
        arguments are not JSON, or an input with no message."""
        out: list[Message] = []
        if self.instructions:
            out.append({"role": "system", "content": self.instructions})
        items = ([MessageItem(role="user", content=self.input)] if isinstance(self.input, str)
                 else self.input)
        reasoning: str | None = None  # for the next assistant message
        for item in items:
            if isinstance(item, ReasoningItem):
                reasoning = "\n".join(p.text for p in item.content or []) or reasoning
            elif isinstance(item, MessageItem):
                message = {"role": item.role, "content": _message_content(item.content)}
                if item.role == "assistant" and reasoning:
                    message["reasoning_content"], reasoning = reasoning, None
                out.append(message)
            elif isinstance(item, FunctionCallItem | CustomToolCallItem):
                arguments = (item.arguments if isinstance(item, FunctionCallItem)
                             else json.dumps({FREEFORM_INPUT: item.input}, ensure_ascii=False))
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.called_name, "arguments": arguments}}
                if out and out[-1]["role"] == "assistant":
                    out[-1].setdefault("tool_calls", []).append(call)
                else:
                    out.append({"role": "assistant", "content": "", "tool_calls": [call]})
                    if reasoning:
                        out[-1]["reasoning_content"], reasoning = reasoning, None
            else:
                out.append({"role": "tool", "tool_call_id": item.call_id,
                            "content": _text(item.output)})
        if not any(m["role"] != "system" for m in out):
            raise ValueError("The input has no message: send at least one.")
        return [template_message(m) for m in out]

    def tool_request(self) -> ToolRequest | None:
        """What the tools and tool_choice ask for (None: no tools in play); ValueError
        (a 400) for a choice naming no given tool of its type."""
        choice = self.tool_choice
        if isinstance(choice, CustomToolChoice):
            custom = self._custom_tools()
            named = [called for called, (tool, _) in custom.items()
                     if choice.name in (called, tool.name)]
            if not named:
                raise ValueError(f"tool_choice names the custom tool {choice.name!r}, which is "
                                 "not in tools.")
            tool, namespace = custom[named[0]]
            return ToolRequest(self.chat_tools(), "named", named[0], self.parallel_tool_calls,
                               freeform=tool.forced_call(namespace))
        if isinstance(choice, FunctionToolChoice):
            choice = NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
        return ToolRequest.of(self.chat_tools(), choice, self.parallel_tool_calls)

    def chat_tools(self) -> list[ChatTool]:
        """Every tool the model may call as a function, a namespace's by their
        `namespace.name`."""
        out: list[ChatTool] = []
        for tool in self.tools or []:
            out += tool.chat_tools() if isinstance(tool, NamespaceTool) else [tool.chat_tool()]
        return out

    def _custom_tools(self) -> dict[str, tuple[CustomTool, str | None]]:
        """The custom tools by the name the model calls them, with their namespaces."""
        found: dict[str, tuple[CustomTool, str | None]] = {}
        for tool in self.tools or []:
            inner = tool.tools if isinstance(tool, NamespaceTool) else [tool]
            namespace = tool.name if isinstance(tool, NamespaceTool) else None
            for t in inner:
                if isinstance(t, CustomTool):
                    found[_called_name(t.name, namespace)] = (t, namespace)
        return found

    @property
    def tool_names(self) -> ToolNames:
        """How the names the model calls map back to this request's tools."""
        return ToolNames(
            frozenset(t.name for t in self.tools or [] if isinstance(t, NamespaceTool)),
            frozenset(self._custom_tools()))

    def template_kwargs(self) -> dict[str, Any]:
        """The chat template's extra arguments: reasoning.effort's."""
        return effort_kwargs(self.reasoning.effort if self.reasoning is not None else None)

    def output_constraint(self) -> Constraint | None:
        """What text.format asks the output to be (None: free text)."""
        if self.text is None:
            return None
        return format_constraint(self.text.format.response_format(), "text.format")

    def sampling_params(self, constraint: StructuredOutputsParams | None = None) -> SamplingParams:
        """SamplingParams for the request (one sequence: the Responses API has no `n`), with
        the output constraint the route chose (text.format's, or a forced tool call's); a
        SamplingParamsError (a 400) names the request's field."""
        try:
            return SamplingParams(
                n=1,
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                max_tokens=self.max_output_tokens,
                structured_outputs=constraint,
            )
        except SamplingParamsError as exc:
            raise exc.renamed(_SAMPLING_NAMES.get(exc.field, exc.field)) from None
