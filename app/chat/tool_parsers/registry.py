"""The tool call parsers by the name a server is configured with, and `auto` detection."""

from __future__ import annotations

import re

from officellm.app.chat.harmony import is_harmony_template
from officellm.app.chat.tool_parsers.base import ToolCallParser
from officellm.app.chat.tool_parsers.harmony import HarmonyToolParser
from officellm.app.chat.tool_parsers.hermes import START, HermesToolParser
from officellm.app.chat.tool_parsers.llama3_json import PYTHON_TAG, Llama3JsonToolParser

TOOL_CALL_PARSERS: dict[str, ToolCallParser] = {
    "hermes": HermesToolParser(),
    "llama3_json": Llama3JsonToolParser(),
    "harmony": HarmonyToolParser(),
}

# Llama 3.1/3.2's templates ask for 'Respond in the format {"name": function name,
# "parameters": dictionary of argument name and its value}'.
_LLAMA3_INSTRUCTION = re.compile(r'"parameters":\s*dictionary of argument')


def detect_tool_call_format(chat_template: str | None) -> str | None:
    """The parser name whose format `chat_template` teaches the model, or None."""
    if not chat_template:
        return None
    if is_harmony_template(chat_template):
        return "harmony"
    if START in chat_template:
        return "hermes"
    if PYTHON_TAG in chat_template or _LLAMA3_INSTRUCTION.search(chat_template):
        return "llama3_json"
    return None


def parser_for(name: str, chat_template: str | None) -> ToolCallParser | None:
    """The parser for a configured `name`: one of TOOL_CALL_PARSERS, "auto" (detected from
    the model's chat template, None when it shows no known format) or "none" (None).
    ValueError naming the choices for any other name."""
    if name == "none":
        return None
    if name == "auto":
        detected = detect_tool_call_format(chat_template)
        return TOOL_CALL_PARSERS[detected] if detected else None
    try:
        return TOOL_CALL_PARSERS[name]
    except KeyError:
        choices = ", ".join(["auto", "none", *TOOL_CALL_PARSERS])
        raise ValueError(f"unknown tool call parser {name!r}; choose one of: {choices}") from None
