"""OpenAI function tools: the request's tools and tool_choice, and the grammar of a forced call.

`tool_choice` "required" and a named function are constrained by a grammar (an xgrammar
structural tag) to calls in the served model's own tool-call format, with arguments that
match each tool's JSON schema; the same text parser then reads them as it reads the calls
a model makes of its own accord under "auto". One format, one parser, whichever way the
call came.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from officellm.app.chat.harmony import after_analysis, call_begin
from officellm.engine import StructuredOutputError, StructuredOutputsParams, check_json_schema


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object",
                                                               "properties": {}})
    strict: bool | None = None


class ChatTool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


@dataclass(frozen=True)
class CallFormat:
    """How a model writes a call: the text around one call's arguments, and between calls."""

    begin: str  # with {name} for the function's name
    end: str
    separator: str


# The formats of app/chat/tool_parsers, by parser name (harmony's, below, is not one
# tagged block after another).
HARMONY = "harmony"
CALL_FORMATS = {
    "hermes": CallFormat('<tool_call>\n{{"name": "{name}", "arguments": ', "}\n</tool_call>", "\n"),
    "llama3_json": CallFormat('{{"name": "{name}", "parameters": ', "}", "; "),
}


# The one argument a freeform tool (OpenAI's custom tools) is called with here: the model
# sees it as a function of one string, `input`, and writes its calls as it writes any other.
FREEFORM_INPUT = "input"


def freeform_parameters(description: str) -> dict[str, Any]:
    """The JSON schema a freeform tool's function takes: {"input": <text>}."""
    return {"type": "object", "required": [FREEFORM_INPUT],
            "properties": {FREEFORM_INPUT: {"type": "string", "description": description}}}


@dataclass(frozen=True)
class FreeformCall:
    """tool_choice naming a freeform tool: the whole answer is its input (raw text, the
    tool's grammar constraining it where it has one); `system_text` tells the model so."""

    name: str
    system_text: str
    grammar: StructuredOutputsParams | None


@dataclass(frozen=True)
class ToolRequest:
    """What a request's tools mean for this generation: the tools the template sees, and
    whether (and how) calls are forced (`freeform`: the named tool is a freeform one)."""

    tools: list[ChatTool]
    choice: str  # none | auto | required | named
    forced_name: str | None
    parallel: bool
    freeform: FreeformCall | None = None

    @classmethod
    def of(cls, tools: list[ChatTool] | None, tool_choice: ToolChoice | None,
           parallel_tool_calls: bool) -> ToolRequest | None:
        """None when the request has no tools (or tool_choice "none"); ValueError (a 400)
        for a choice that names a tool not in `tools`, or a choice without tools."""
        tools = list(tools or [])
        if isinstance(tool_choice, NamedToolChoice):
            name = tool_choice.function.name
            if name not in {t.function.name for t in tools}:
                raise ValueError(f"tool_choice names the function {name!r}, which is not in "
                                 "tools.")
            return cls(tools, "named", name, parallel_tool_calls)
        if not tools:
            if tool_choice in ("required",):
                raise ValueError("tool_choice 'required' needs at least one tool in tools.")
            return None
        for tool in tools:
            try:
                check_json_schema(tool.function.parameters)
            except StructuredOutputError as exc:
                raise ValueError(f"Tool {tool.function.name!r}: {exc}") from None
        choice = tool_choice or "auto"
        if choice == "none":
            return None
        return cls(tools, choice, None, parallel_tool_calls)

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "named")

    def template_tools(self) -> list[dict[str, Any]]:
        """The tools as chat templates read them (transformers' `tools=`)."""
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def grammar(self, parser_name: str) -> StructuredOutputsParams:
        """The structural tag that forces calls in `parser_name`'s format: exactly the named
        function, or one or more (one, without parallel_tool_calls) of the tools."""
        chosen = [t for t in self.tools
                  if self.forced_name is None or t.function.name == self.forced_name]
        body = (_harmony_call(chosen) if parser_name == HARMONY
                else self._tagged_calls(chosen, CALL_FORMATS[parser_name]))
        return StructuredOutputsParams(
            structural_tag=json.dumps({"type": "structural_tag", "format": body}))

    def _tagged_calls(self, chosen: list[ChatTool], fmt: CallFormat) -> dict[str, Any]:
        tags = [{"type": "tag", "begin": fmt.begin.format(name=t.function.name),
                 "content": _arguments(t), "end": fmt.end} for t in chosen]
        if self.choice == "named":
            return tags[0]
        return {"type": "tags_with_separator", "tags": tags, "separator": fmt.separator,
                "at_least_one": True, "stop_after_first": not self.parallel}


def _arguments(tool: ChatTool) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": tool.function.parameters}


def _harmony_call(chosen: list[ChatTool]) -> dict[str, Any]:
    """gpt-oss's forced call: its analysis message if it writes one, then one call of one of
    `chosen` (gpt-oss calls one function a turn: it stops at `<|call|>`, so a required call
    is one whatever parallel_tool_calls says). The grammar ends with the arguments, where the
    model's own stop token (`<|call|>`) may end the turn."""
    calls = [{"type": "tag", "begin": call_begin(t.function.name), "content": _arguments(t),
              "end": ""} for t in chosen]
    return after_analysis(calls[0] if len(calls) == 1 else {"type": "or", "elements": calls})


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as chat templates expect it: an assistant's tool-call arguments as objects
    (OpenAI sends them as JSON text; Qwen's and Llama's templates `tojson` them)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    out = []
    for call in calls:
        fn = dict((call or {}).get("function") or {})
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                fn["arguments"] = json.loads(args) if args.strip() else {}
            except ValueError:
                raise ValueError(f"The arguments of tool call {call.get('id')!r} in the history "
                                 "are not valid JSON.") from None
        out.append({**call, "function": fn})
    return {**message, "tool_calls": out}


def tools_system_text(tools: list[ChatTool], parser_name: str) -> str:
    """What a model whose chat template teaches no tool format is told of the tools, in a
    system message: each function and its arguments' schema, and how a call is written in
    `parser_name`'s format (the one its reply is read with, and a forced call's grammar
    writes)."""
    listing = json.dumps([t.function.model_dump(exclude_none=True) for t in tools])
    fmt = CALL_FORMATS[parser_name]
    example = fmt.begin.format(name="NAME") + "ARGUMENTS" + fmt.end
    return (f"You can call these functions (JSON schema of each one's arguments): {listing}\n"
            f"To call one, reply with {example}, with the function's name for NAME and a JSON "
            "object of its arguments for ARGUMENTS. When no function helps, reply in plain "
            "text.")


# How a tool's result reaches a model taught the generic format, as Hermes-style models read
# it (Qwen's templates wrap results the same way).
TOOL_RESPONSE = "<tool_response>\n{content}\n</tool_response>"


def text_tool_turns(messages: list[dict[str, Any]], parser_name: str) -> list[dict[str, Any]]:
    """Earlier tool turns as text, for a template that renders neither calls nor results
    (Gemma 3's refuses a `tool` message, Phi-4's drops it, both drop `tool_calls`): an
    assistant's calls join its content in `parser_name`'s format, the one the model was
    taught, and results become user text, consecutive ones (and a user message right after
    them) one message, as templates that insist on user/assistant turns need."""
    fmt = CALL_FORMATS[parser_name]
    out: list[dict[str, Any]] = []
    merge = False  # the last message is results: user text that follows joins it
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            calls = fmt.separator.join(
                fmt.begin.format(name=fn.get("name", "")) + json.dumps(
                    fn.get("arguments") or {}, ensure_ascii=False) + fmt.end
                for fn in ((call or {}).get("function") or {} for call in message["tool_calls"]))
            text = "\n".join(t for t in (message.get("content") or "", calls) if t)
            out.append({**{k: v for k, v in message.items() if k != "tool_calls"},
                        "content": text})
            merge = False
        elif role == "user" and merge and isinstance(message.get("content"), list):
            # A user's parts (an image among them: app/chat/image_parts.py) after results:
            # the results' text becomes their first part, so the image stays a part.
            results = {"type": "text", "text": out[-1]["content"]}
            out[-1] = {**out[-1], "content": [results, *message["content"]]}
            merge = False
        elif role in ("tool", "user") and (role == "tool" or merge):
            text = (TOOL_RESPONSE.format(content=message.get("content") or "")
                    if role == "tool" else message.get("content") or "")
            if merge:
                out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n{text}"}
            else:
                out.append({"role": "user", "content": text})
            merge = role == "tool" or merge
        else:
            out.append(message)
            merge = False
    return out
