"""How the served model writes tool calls and reasoning, and what that means for one chat
request: its output constraint, what its template is given, and how its text is read.

Resolved once when the model loads (the chat template decides `auto`); every rule about
tools, tool_choice and reasoning for a request is decided here, in `plan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from officellm.app.chat.chat_output import ChatOutputReader
from officellm.app.chat.output_constraint import Constraint
from officellm.app.chat.reasoning_parsers import ReasoningParser, reasoning_parser_for
from officellm.app.chat.tool_parsers import TOOL_CALL_PARSERS, detect_tool_call_format
from officellm.app.chat.tool_parsers.whole_answer import WholeAnswerCallParser
from officellm.app.chat.tools import FreeformCall, ToolRequest, tools_system_text

# A model whose template teaches no format of its own is taught the Hermes one: its calls,
# forced or of its own accord, are written and read that way.
DEFAULT_CALL_FORMAT = "hermes"


@dataclass(frozen=True)
class ChatPlan:
    """One request's output plan: the constraint (None: free text), extra chat-template
    arguments, a system text to prepend (tools for a template that ignores them), the
    reader of its choices, and the kind counted in metrics and the access log."""

    constraint: Constraint | None
    reader: ChatOutputReader
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    system_text: str | None = None
    kind: str | None = None

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages as the template renders them (with the tools' system text)."""
        if self.system_text is None:
            return messages
        if messages and messages[0].get("role") == "system":
            first = messages[0]
            joined = f"{first.get('content') or ''}\n\n{self.system_text}".strip()
            return [{**first, "content": joined}, *messages[1:]]
        return [{"role": "system", "content": self.system_text}, *messages]


@dataclass(frozen=True)
class ChatFormats:
    """The served model's tool-call format (None: its template teaches none the server can
    read), the format forced calls use, its reasoning parser, whether its template renders
    tools, and whether a model without a format of its own is taught the generic one (the
    default: --tool-call-parser auto; `none` turns tool calling off)."""

    tool_format: str | None
    reasoning: ReasoningParser | None
    template_renders_tools: bool
    enable_auto_tool_choice: bool
    generic_tool_calls: bool = True

    @classmethod
    def resolve(cls, chat_template: str | None, tool_call_parser: str, reasoning_parser: str,
                enable_auto_tool_choice: bool) -> ChatFormats:
        """The formats for a model with this chat template and the server's flags."""
        template = chat_template or ""
        if tool_call_parser == "auto":
            tool_format = detect_tool_call_format(template)
        else:
            tool_format = None if tool_call_parser == "none" else tool_call_parser
        if reasoning_parser == "auto":
            reasoning_parser = "qwen3" if "<think>" in template else "none"
        reasoning = None if reasoning_parser == "none" else reasoning_parser_for(reasoning_parser)
        return cls(tool_format, reasoning, "tools" in template, enable_auto_tool_choice,
                   generic_tool_calls=tool_call_parser != "none")

    @property
    def call_format(self) -> str:
        """The format calls are written (forced ones by a grammar) and read in."""
        return self.tool_format or DEFAULT_CALL_FORMAT

    def plan(self, tools: ToolRequest | None, constraint: Constraint | None) -> ChatPlan:
        """The plan of a request with these tools and this output constraint. ValueError
        (a 400) for what cannot be honoured: a forced call together with a constraint, or
        tool_choice auto with auto choice off or tool calling off (--tool-call-parser none).

        A model whose template teaches no tool format (the bundled SmolLM2) is taught the
        generic one, as llama.cpp's server does: a system message lists the tools and says
        how a call is written (the format forced calls use); the reply is read as calls when
        it writes them, else as text. So a front end that attaches tools to every message
        (Open WebUI's built-in tools) gets answers, not a 400."""
        if tools is None:
            return ChatPlan(constraint, ChatOutputReader(self.reasoning),
                            kind=constraint.kind if constraint else None)
        if tools.forced:
            if constraint is not None:
                raise ValueError("A forced tool_choice and an output constraint "
                                 "(response_format or text.format, structured_outputs or "
                                 "guided_*) cannot both apply; send one of them.")
            if tools.freeform is not None:
                return self._freeform_plan(tools.freeform)
            fmt = self.call_format
            constraint = Constraint(tools.grammar(fmt), f"tool_{tools.choice}")
        elif not self.enable_auto_tool_choice:
            raise ValueError("tool_choice 'auto' is off on this server (started with "
                             "--no-enable-auto-tool-choice); use tool_choice 'required' or "
                             "name a function.")
        elif self.tool_format is None and not self.generic_tool_calls:
            raise ValueError("Tool calling is off on this server (started with "
                             "--tool-call-parser none), so the model cannot call tools of its "
                             "own accord (tool_choice 'auto'); use tool_choice 'required' or "
                             "name a function.")
        else:
            fmt = self.call_format
        reader = ChatOutputReader(self.reasoning, TOOL_CALL_PARSERS[fmt])
        kind = constraint.kind if constraint is not None and tools.forced else "tool_auto"
        if self.template_renders_tools and self.tool_format is not None:
            # The template teaches the model its own format, which `fmt` reads.
            return ChatPlan(constraint, reader, {"tools": tools.template_tools()}, kind=kind)
        return ChatPlan(constraint, reader, system_text=tools_system_text(tools.tools, fmt),
                        kind=kind)

    def _freeform_plan(self, call: FreeformCall) -> ChatPlan:
        """A forced freeform call: no tool format at all (the model would wrap its input in
        one), the whole answer read as the call's input, under the tool's grammar."""
        grammar = Constraint(call.grammar, "tool_named") if call.grammar is not None else None
        reader = ChatOutputReader(self.reasoning, WholeAnswerCallParser(call.name))
        return ChatPlan(grammar, reader, system_text=call.system_text, kind="tool_named")
