"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API request (pydantic),
and its translation into what the chat pipeline runs: template messages, a ToolRequest, an
output Constraint, SamplingParams and the chat template's thinking switch.

Unlike the OpenAI routes, a field this module does not know is refused (a 400 naming it):
Anthropic's API grows fields that change the output (server tools, MCP servers, containers),
and one silently ignored would answer something the client did not ask for. The fields that
change nothing for a local model are accepted and listed in IGNORED_FIELDS (docs/clients.md
says why each is harmless). What is honoured: `system` (a string or text blocks; Claude
Code's per-request billing block is dropped, docs/clients.md), text, tool_use, tool_result
and thinking blocks in the history, image blocks (base64 or url sources, for a vision
model: app/chat/image_parts.py), custom tools, tool_choice, max_tokens, temperature,
top_p, top_k, stop_sequences, thinking (the template's switch), output_config.format (a JSON
schema the grammar enforces) and metadata.user_id (the person, on a front-end key).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from officellm.app.chat.image_parts import image_part, part_content, text_part
from officellm.app.chat.output_constraint import Constraint, JSONSchemaFormat, ResponseFormat
from officellm.app.chat.output_constraint import format_constraint as _format_constraint
from officellm.app.chat.reasoning_effort import budget_effort, effort_kwargs
from officellm.app.chat.tools import (
    ChatTool,
    FunctionDefinition,
    NamedFunction,
    NamedToolChoice,
    ToolRequest,
    template_message,
)
from officellm.app.openai.protocol import bounded
from officellm.engine import SamplingParams, SamplingParamsError, StructuredOutputsParams

Message = dict[str, Any]

# Claude Code (from 2.1.36) puts a text block starting with this first in `system`, with a
# nonce that differs on every request: kept, it would make every prompt's prefix new to the
# prefix cache. It says nothing to the model.
BILLING_HEADER = "x-anthropic-billing-header:"

# Request fields that change nothing for a model served here, accepted and ignored:
# prompt-cache markers (the prefix cache needs none), Anthropic's context editing and service
# tiers, the effort hint of its own models, the region and speed of its fleet, diagnostics.
IGNORED_FIELDS = ("cache_control", "context_management", "service_tier", "inference_geo",
                  "speed", "diagnostics", "container")
# Block fields of the same kind: cache markers and citations (sources this server never cites).
_BLOCK_IGNORED = ConfigDict(extra="ignore")
_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)
# SamplingParams' field -> the request's, where they differ (for a 400's `param`).
_SAMPLING_NAMES = {"stop": "stop_sequences"}


def _text_or_blocks(name: str) -> Discriminator:
    """Tell a text from a list of blocks by its type (the other branch's errors would only
    confuse)."""
    return Discriminator(lambda value: "Text" if isinstance(value, str) else name)


# -- content blocks -----------------------------------------------------------------------

class TextBlock(BaseModel):
    model_config = _BLOCK_IGNORED

    type: Literal["text"]
    text: str


# A system prompt, or a tool result's content: a text, or text blocks.
TextContent = Annotated[
    Annotated[str, Tag("Text")] | Annotated[list[TextBlock], Tag("TextBlocks")],
    _text_or_blocks("TextBlocks"),
]


class ToolUseBlock(BaseModel):
    """A call the model made in an earlier turn (assistant)."""

    model_config = _BLOCK_IGNORED

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(BaseModel):
    """A call's result (user), by the call's id; its content is text or text blocks."""

    model_config = _BLOCK_IGNORED

    type: Literal["tool_result"]
    tool_use_id: str
    content: TextContent = ""
    is_error: bool = False

    def text(self) -> str:
        body = (self.content if isinstance(self.content, str)
                else "\n".join(b.text for b in self.content))
        # The template has no place for the flag: the model reads it in the result.
        return f"Error: {body}" if self.is_error else body


class ThinkingBlock(BaseModel):
    """An earlier answer's thinking (assistant): its text goes back to the template as the
    message's reasoning_content; the signature means nothing here."""

    model_config = _BLOCK_IGNORED

    type: Literal["thinking"]
    thinking: str


class ImageSource(BaseModel):
    """Where an image block's picture is: inline base64 with its media type, or a URL."""

    model_config = _BLOCK_IGNORED

    type: Literal["base64", "url", "file"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> ImageSource:
        if self.type == "file":
            raise ValueError("An image source of type 'file' is not supported: this server "
                             "has no files API; send the image as base64 or a url.")
        if self.type == "base64" and (self.media_type is None or self.data is None):
            raise ValueError("A base64 image source needs media_type and data.")
        if self.type == "url" and self.url is None:
            raise ValueError("A url image source needs url.")
        return self

    def image_url(self) -> str:
        """The picture as the other APIs name one: a data URI, or the URL."""
        if self.type == "base64":
            return f"data:{self.media_type};base64,{self.data}"
        assert self.url is not None  # _complete
        return self.url


class ImageBlock(BaseModel):
    """A picture in a user's turn (a screenshot, a scanned page), for a vision model."""

    model_config = _BLOCK_IGNORED

    type: Literal["image"]
    source: ImageSource


class RedactedThinkingBlock(BaseModel):
    """Encrypted thinking from Anthropic's own models: nothing here can read it; dropped."""

    model_config = _BLOCK_IGNORED

    type: Literal["redacted_thinking"]


_BLOCKS = {"text": TextBlock, "image": ImageBlock, "tool_use": ToolUseBlock,
           "tool_result": ToolResultBlock, "thinking": ThinkingBlock,
           "redacted_thinking": RedactedThinkingBlock}


def _block_type(block: Any) -> str | None:
    if isinstance(block, dict):
        model = _BLOCKS.get(block.get("type")) if isinstance(block.get("type"), str) else None
        return model.__name__ if model is not None else None
    return type(block).__name__ if isinstance(block, tuple(_BLOCKS.values())) else None


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("TextBlock")]
    | Annotated[ImageBlock, Tag("ImageBlock")]
    | Annotated[ToolUseBlock, Tag("ToolUseBlock")]
    | Annotated[ToolResultBlock, Tag("ToolResultBlock")]
    | Annotated[ThinkingBlock, Tag("ThinkingBlock")]
    | Annotated[RedactedThinkingBlock, Tag("RedactedThinkingBlock")],
    Discriminator(_block_type, custom_error_type="content_block",
                  custom_error_message="Each content block is an object with a type: text, "
                                       "image, tool_use, tool_result, thinking or "
                                       "redacted_thinking."),
]
# Pydantic puts these tags in an error's path: no field of the request (error_handlers).
UNION_TAGS = frozenset({"Text", "Blocks", "TextBlocks",
                        *(model.__name__ for model in _BLOCKS.values())})


def _unsupported_block(kind: Any, where: str) -> str:
    if kind == "image":  # only inside a tool_result: the top level takes images
        return (f"An image block inside a tool_result ({where}) is not supported: send the "
                "image in the user's message beside the result.")
    if kind in ("document", "search_result"):
        return (f"Content block type {kind!r} ({where}) is not supported: send the content "
                "as text.")
    return (f"Content block type {kind!r} ({where}) is not supported: send text, image, "
            "tool_use, tool_result, thinking and redacted_thinking blocks (this server runs "
            "no server tools).")


Content = Annotated[
    Annotated[str, Tag("Text")] | Annotated[list[ContentBlock], Tag("Blocks")],
    _text_or_blocks("Blocks"),
]


class InputMessage(BaseModel):
    """A turn: the user's or the assistant's, or (Claude Code's "mid-conversation system"
    beta) system instructions given at that point of the conversation."""

    model_config = _STRICT

    role: Literal["user", "assistant", "system"]
    content: Content

    def blocks(self) -> list[Any]:
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) \
            else list(self.content)


# -- tools --------------------------------------------------------------------------------

class CustomTool(BaseModel):
    """A client tool: {name, description, input_schema}; `type` "custom" or absent. Strict
    or not, the grammar holds a forced call to its schema."""

    model_config = _BLOCK_IGNORED  # cache_control, defer_loading, input_examples, strict

    type: Literal["custom"] | None = None
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    input_schema: dict[str, Any]

    def chat_tool(self) -> ChatTool:
        # Anthropic allows 128-character names, OpenAI's model 64: this name is checked above.
        fn = FunctionDefinition.model_construct(name=self.name, description=self.description,
                                                parameters=self.input_schema, strict=None)
        return ChatTool(type="function", function=fn)


class ToolChoice(BaseModel):
    model_config = _STRICT

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("tool_choice of type 'tool' names one tool (name), and only it.")
        return self


class Thinking(BaseModel):
    """enabled (with a budget), adaptive or disabled. The chat template's enable_thinking
    switch is what a local model has; budget_tokens is bounded by max_tokens only."""

    model_config = _STRICT

    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = Field(None, ge=1)
    display: Literal["summarized", "omitted"] | None = None

    @property
    def on(self) -> bool:
        return self.type != "disabled"


class OutputFormat(BaseModel):
    model_config = _STRICT

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema", min_length=1)


class OutputConfig(BaseModel):
    model_config = _STRICT

    # The template's reasoning_effort (gpt-oss's), app/chat/reasoning_effort.py.
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class Metadata(BaseModel):
    model_config = _STRICT

    user_id: str | None = None


# -- the requests -------------------------------------------------------------------------

class _Conversation(BaseModel):
    """What count_tokens and messages share: the conversation, its tools and its switches."""

    model_config = _STRICT

    model: str | None = None  # Anthropic requires it; here None is the served model
    messages: list[InputMessage] = Field(min_length=1)
    system: TextContent | None = None
    tools: list[CustomTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    # IGNORED_FIELDS: accepted, changing nothing here.
    cache_control: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None
    service_tier: str | None = None
    inference_geo: str | None = None
    speed: str | None = None
    diagnostics: dict[str, Any] | None = None
    container: str | dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_blocks_and_tools(cls, data: Any) -> Any:
        """Name what cannot be served: a block type (an image, a server tool's result) or a
        tool type (a server tool, or one whose schema only Anthropic's models know)."""
        if not isinstance(data, dict):
            return data
        unknown = sorted(set(data) - set(cls.model_fields))
        if unknown:
            raise ValueError(f"Field {unknown[0]!r} is not supported by this server: it would "
                             "change the answer in a way a local model cannot honour (the "
                             "fields it accepts are listed in docs/clients.md).")
        # Not a list: the field's own validation says so after this.
        messages, tools = data.get("messages"), data.get("tools")
        for i, message in enumerate(messages if isinstance(messages, list) else []):
            content = message.get("content") if isinstance(message, dict) else None
            for j, block in enumerate(content if isinstance(content, list) else []):
                kind = block.get("type") if isinstance(block, dict) else None
                if isinstance(kind, str) and kind not in _BLOCKS:
                    raise ValueError(_unsupported_block(kind, f"messages.{i}.content.{j}"))
                inner = block.get("content") if kind == "tool_result" else None
                for k, part in enumerate(inner if isinstance(inner, list) else []):
                    part_kind = part.get("type") if isinstance(part, dict) else None
                    if isinstance(part_kind, str) and part_kind != "text":
                        raise ValueError(_unsupported_block(
                            part_kind, f"messages.{i}.content.{j}.content.{k}"))
        for i, tool in enumerate(tools if isinstance(tools, list) else []):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind not in (None, "custom"):
                raise ValueError(f"Tool type {kind!r} (tools.{i}) is not supported: this "
                                 "server runs no server tools, and the schemas of Anthropic's "
                                 "own client tools are its models' alone; give custom tools "
                                 "(name, description, input_schema), which the client runs.")
        return data

    def system_text(self) -> str | None:
        """The system prompt as one text, without Claude Code's billing block."""
        if self.system is None or isinstance(self.system, str):
            return self.system or None
        parts = [b.text for b in self.system if not b.text.startswith(BILLING_HEADER)]
        return "\n\n".join(parts) or None

    def template_messages(self) -> list[Message]:
        """The conversation as chat-template messages: the system prompt first; each
        tool_result a `tool` message (in the order given, before the user's text that follows
        it); an assistant's thinking its reasoning_content, its tool_use blocks its tool_calls.
        Consecutive messages of one role are one turn, as Anthropic combines them; a system
        message in the list stays where it is."""
        out: list[Message] = []
        system = self.system_text()
        if system:
            out.append({"role": "system", "content": system})
        for message in self.messages:
            if message.role == "assistant":
                _add_assistant(out, message.blocks())
            elif message.role == "system":
                # Kept where it was given: moved to the top, it would change the prompt's
                # prefix (and miss the prefix cache) whenever a new one arrives.
                out.append({"role": "system", "content": _system_text(message.blocks())})
            else:
                _add_user(out, message.blocks())
        return [template_message(m) for m in out]

    @property
    def continues_answer(self) -> bool:
        """Whether the last message is the assistant's: the answer continues it (prefill)."""
        return self.messages[-1].role == "assistant"

    def tool_request(self) -> ToolRequest | None:
        """What tools and tool_choice ask for (None: no tools in play); ValueError (a 400)
        for a choice naming no given tool, or one without tools."""
        choice = self.tool_choice
        tools = [t.chat_tool() for t in self.tools or []]
        parallel = not (choice is not None and choice.disable_parallel_tool_use)
        if choice is None or choice.type == "auto":
            return ToolRequest.of(tools, "auto", parallel) if tools else None
        if choice.type == "none":
            return None
        if choice.type == "any":
            return ToolRequest.of(tools, "required", parallel)
        assert choice.name is not None
        named = NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
        return ToolRequest.of(tools, named, parallel)

    def output_constraint(self) -> Constraint | None:
        """output_config.format: a JSON schema the output must match (None: free text)."""
        fmt = self.output_config.format if self.output_config is not None else None
        if fmt is None:
            return None
        response_format = ResponseFormat(type="json_schema",
                                         json_schema=JSONSchemaFormat(schema=fmt.schema_))
        return _format_constraint(response_format, "output_config.format")

    def template_kwargs(self) -> dict[str, Any]:
        """The chat template's thinking switch: on for enabled and adaptive thinking, off
        when disabled or absent (Anthropic's default); and its reasoning effort:
        output_config.effort, else the thinking budget's, else low without thinking (a
        model that always reasons, gpt-oss, reasons least), else the template's default.
        Templates without either ignore it."""
        thinking = self.thinking
        on = thinking is not None and thinking.on
        kwargs: dict[str, Any] = {"enable_thinking": on,
                                  **effort_kwargs(self._effort(thinking if on else None))}
        if self.continues_answer:
            kwargs["continue_final_message"] = True
        return kwargs

    def _effort(self, thinking: Thinking | None) -> str | None:
        """The effort word of output_config.effort or of thinking that is on (None: off)."""
        if self.output_config is not None and self.output_config.effort is not None:
            return self.output_config.effort
        if thinking is None:
            return "low"
        return budget_effort(thinking.budget_tokens) if thinking.budget_tokens else None


def _system_text(blocks: list[Any]) -> str:
    if not all(isinstance(b, TextBlock) for b in blocks):
        raise ValueError("A system message holds text only.")
    return "\n\n".join(b.text for b in blocks)


def _add_user(out: list[Message], blocks: list[Any]) -> None:
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, ToolResultBlock):
            _flush_user(out, parts)
            parts = []
            out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                        "content": block.text()})
        elif isinstance(block, TextBlock):
            parts.append(text_part(block.text))
        elif isinstance(block, ImageBlock):
            parts.append(image_part(block.source.image_url()))
        else:
            raise ValueError(f"A user message cannot hold a {block.type} block (only the "
                             "assistant's messages do).")
    _flush_user(out, parts)


def _flush_user(out: list[Message], parts: list[dict[str, Any]]) -> None:
    """The user's text (blocks joined by blank lines) or, with an image, its parts, added to
    the user's turn before it if there is one (Anthropic combines consecutive turns)."""
    if not parts:
        return
    if out and out[-1]["role"] == "user":
        before = out[-1]["content"]
        parts = [text_part(before)] + parts if isinstance(before, str) else before + parts
    out_content = part_content(parts, "\n\n")
    if out and out[-1]["role"] == "user":
        out[-1]["content"] = out_content
    else:
        out.append({"role": "user", "content": out_content})


def _add_assistant(out: list[Message], blocks: list[Any]) -> None:
    if not (out and out[-1]["role"] == "assistant"):
        out.append({"role": "assistant", "content": ""})
    message = out[-1]
    for block in blocks:
        if isinstance(block, TextBlock):
            message["content"] = "\n\n".join(p for p in (message["content"], block.text) if p)
        elif isinstance(block, ThinkingBlock):
            message["reasoning_content"] = "\n\n".join(
                p for p in (message.get("reasoning_content"), block.thinking) if p)
        elif isinstance(block, ToolUseBlock):
            message.setdefault("tool_calls", []).append(
                {"id": block.id, "type": "function",
                 "function": {"name": block.name, "arguments": json.dumps(block.input)}})
        elif isinstance(block, ToolResultBlock | ImageBlock):
            raise ValueError(f"An assistant message cannot hold a {block.type} block (the "
                             "user's messages carry them).")


class CountTokensRequest(_Conversation):
    """POST /v1/messages/count_tokens: the prompt's size, nothing generated."""


class MessagesRequest(_Conversation):
    """POST /v1/messages."""

    max_tokens: int = Field(json_schema_extra=bounded("max_tokens"))
    # Anthropic's own ceiling (SamplingParams only needs temperature >= 0).
    temperature: float | None = Field(None, le=1.0, json_schema_extra=bounded("temperature"))
    top_p: float | None = Field(None, json_schema_extra=bounded("top_p"))
    top_k: int | None = Field(None, json_schema_extra=bounded("top_k"))
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: Metadata | None = None

    @property
    def user(self) -> str | None:
        """metadata.user_id: the person a front-end key's request is for (as OpenAI's `user`)."""
        return self.metadata.user_id if self.metadata is not None else None

    @property
    def shows_thinking(self) -> bool:
        """Whether thinking text is returned (display "omitted": blocks without their text)."""
        return self.thinking is None or self.thinking.display != "omitted"

    def sampling_params(self, constraint: StructuredOutputsParams | None) -> SamplingParams:
        """SamplingParams for the request, with the output constraint the route chose (the
        format's or a forced tool call's); a SamplingParamsError (a 400) names the field."""
        try:
            return SamplingParams(
                n=1,
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                top_k=self.top_k or 0,
                max_tokens=self.max_tokens,
                stop=list(self.stop_sequences or []),
                structured_outputs=constraint,
            )
        except SamplingParamsError as exc:
            raise exc.renamed(_SAMPLING_NAMES.get(exc.field, exc.field)) from None
