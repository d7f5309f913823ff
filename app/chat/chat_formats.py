"""How the served model writes tool calls and reasoning, and what that means for one chat
request: its output constraint, what its template is given, and how its text is read.

Resolved once when the model loads (the chat template decides `auto`); every rule about
tools, tool_choice and reasoning for a request is decided here, in `plan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from officellm.app.chat.chat_output import ChatOutputReader
from officellm.app.chat.harmony import is_harmony_template, template_history
from officellm.app.chat.output_constraint import Constraint
from officellm.app.chat.reasoning_parsers import ReasoningParser, reasoning_parser_for
from officellm.app.chat.tool_parsers import TOOL_CALL_PARSERS, detect_tool_call_format
from officellm.app.chat.tool_parsers.harmony import HarmonyToolParser
from officellm.app.chat.tool_parsers.whole_answer import WholeAnswerCallParser
from officellm.app.chat.tools import (
    HARMONY,
    FreeformCall,
    ToolRequest,
    text_tool_turns,
    tools_system_text,
)
from officellm.engine import SamplingParams

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
    # The reader parses the model's special tokens (harmony's markers): the engine must keep
    # them in the text it decodes. The reader leaves none in what the client gets.
    keep_special_tokens: bool = False
    # How earlier turns reach the template: as they are (None), with their reasoning as
    # gpt-oss's `thinking` ("harmony"), or with tool calls and results as text in this call
    # format, for a template that renders no tool turns (a CALL_FORMATS name).
    history: str | None = None

    def sampling_params(self, params: SamplingParams) -> SamplingParams:
        """`params` as this plan's reading needs the engine to decode: the one place a
        reader's need for special tokens reaches the engine."""
        if self.keep_special_tokens and params.skip_special_tokens:
            return replace(params, skip_special_tokens=False)
        return params

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages as the template renders them (with the tools' system text)."""
        if self.history == HARMONY:
            messages = template_history(messages)
        elif self.history is not None:
            messages = text_tool_turns(messages, self.history)
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
    read), its reasoning parser, whether its template renders tools, whether a model without
    a format of its own is taught the generic one (the default: --tool-call-parser auto;
    `none` turns tool calling off), whether it writes OpenAI's harmony format (gpt-oss),
    whose markers every reply of it is read out of, tools or not, and whether its template
    renders earlier tool calls and results (it names `tool_calls`); when not, they reach it
    as text in the call format (tools.text_tool_turns)."""

    tool_format: str | None
    reasoning: ReasoningParser | None
    template_renders_tools: bool
    enable_auto_tool_choice: bool
    generic_tool_calls: bool = True
    harmony: bool = False
    template_renders_tool_turns: bool = True

    @classmethod
    def resolve(cls, chat_template: str | None, tool_call_parser: str, reasoning_parser: str,
                enable_auto_tool_choice: bool) -> ChatFormats:
        """The formats for a model with this chat template and the server's flags.

        A model is a harmony one when its template writes harmony or either flag names it;
        then `auto` means harmony for both. ValueError for a harmony model with another
        family's parser, which could not read its turns."""
        template = chat_template or ""
        harmony = is_harmony_template(template) or HARMONY in (tool_call_parser,
                                                               reasoning_parser)
        if harmony:
            for flag, name in (("--tool-call-parser", tool_call_parser),
                               ("--reasoning-parser", reasoning_parser)):
                if name not in ("auto", "none", HARMONY):
                    raise ValueError(f"{flag} {name} cannot read this model's turns, which "
                                     "are in OpenAI's harmony format (gpt-oss): use harmony "
                                     "or auto.")
        if tool_call_parser == "auto":
            tool_format = HARMONY if harmony else detect_tool_call_format(template)
        else:
            tool_format = None if tool_call_parser == "none" else tool_call_parser
        if reasoning_parser == "auto":
            reasoning_parser = (HARMONY if harmony else
                                "qwen3" if "<think>" in template else "none")
        reasoning = None if reasoning_parser == "none" else reasoning_parser_for(reasoning_parser)
        return cls(tool_format, reasoning, "tools" in template, enable_auto_tool_choice,
                   generic_tool_calls=tool_call_parser != "none", harmony=harmony,
                   template_renders_tool_turns="tool_calls" in template)

    @property
    def call_format(self) -> str:
        """The format calls are written (forced ones by a grammar) and read in."""
        if self.harmony:
            return HARMONY
        return self.tool_format or DEFAULT_CALL_FORMAT

    def plan(self, tools: ToolRequest | None, constraint: Constraint | None) -> ChatPlan:
        """The plan of a request with these tools and this output constraint. ValueError
        (a 400) for what cannot be honoured: a forced call together with a constraint, or
        tool_choice auto with auto choice off or tool calling off (--tool-call-parser none),
        or, on a harmony model, a custom tool's grammar. A harmony model's output constraint
        holds its final message, its analysis left free (Constraint.as_harmony_answer).

        A model whose template teaches no tool format (the bundled SmolLM2) is taught the
        generic one, as llama.cpp's server does: a system message lists the tools and says
        how a call is written (the format forced calls use); the reply is read as calls when
        it writes them, else as text. So a front end that attaches tools to every message
        (Open WebUI's built-in tools) gets answers, not a 400."""
        if self.harmony and constraint is not None:
            constraint = constraint.as_harmony_answer()
        if tools is None:
            return self._plan(constraint, self._reader(None),
                              kind=constraint.kind if constraint else None)
        if tools.forced:
            if constraint is not None:
                raise ValueError("A forced tool_choice and an output constraint "
                                 "(response_format or text.format, structured_outputs or "
                                 "guided_*) cannot both apply; send one of them.")
            if tools.freeform is not None and not self.harmony:
                return self._freeform_plan(tools.freeform)
            if tools.freeform is not None and tools.freeform.grammar is not None:
                raise ValueError(f"The custom tool {tools.freeform.name!r} has a grammar, which "
                                 "cannot constrain a forced call on this model: gpt-oss writes "
                                 "a call's input inside JSON. Force it without the grammar, "
                                 "or leave tool_choice to the model.")
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
        reader = self._reader(fmt)
        kind = constraint.kind if constraint is not None and tools.forced else "tool_auto"
        if self.harmony or (self.template_renders_tools and self.tool_format is not None):
            # The template teaches the model its own format, which `fmt` reads.
            return self._plan(constraint, reader, {"tools": tools.template_tools()}, kind=kind)
        return self._plan(constraint, reader, system_text=tools_system_text(tools.tools, fmt),
                          kind=kind)

    def _reader(self, call_format: str | None) -> ChatOutputReader:
        """The reader of a reply whose calls are in `call_format` (None: no tools in play).
        A harmony model's replies all end with the harmony reader, calls or not: only it
        takes the markers out of the answer."""
        if self.harmony:
            return ChatOutputReader(self.reasoning, HarmonyToolParser(call_format is not None))
        tools = TOOL_CALL_PARSERS[call_format] if call_format is not None else None
        return ChatOutputReader(self.reasoning, tools)

    def _plan(self, constraint: Constraint | None, reader: ChatOutputReader,
              template_kwargs: dict[str, Any] | None = None, system_text: str | None = None,
              kind: str | None = None) -> ChatPlan:
        return ChatPlan(constraint, reader, template_kwargs or {}, system_text, kind,
                        keep_special_tokens=self.harmony, history=self._history)

    @property
    def _history(self) -> str | None:
        if self.harmony:
            return HARMONY
        return None if self.template_renders_tool_turns else self.call_format

    def _freeform_plan(self, call: FreeformCall) -> ChatPlan:
        """A forced freeform call: no tool format at all (the model would wrap its input in
        one), the whole answer read as the call's input, under the tool's grammar."""
        grammar = Constraint(call.grammar, "tool_named") if call.grammar is not None else None
        reader = ChatOutputReader(self.reasoning, WholeAnswerCallParser(call.name))
        return self._plan(grammar, reader, system_text=call.system_text, kind="tool_named")
