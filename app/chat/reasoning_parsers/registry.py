"""The reasoning parsers by the name a server is configured with."""

from __future__ import annotations

from officellm.app.chat.reasoning_parsers.base import ReasoningParser
from officellm.app.chat.reasoning_parsers.harmony import HarmonyReasoningParser
from officellm.app.chat.reasoning_parsers.think import ThinkReasoningParser

REASONING_PARSERS: dict[str, ReasoningParser] = {
    "qwen3": ThinkReasoningParser(opened_in_prompt=False),
    "deepseek_r1": ThinkReasoningParser(opened_in_prompt=True),
    "harmony": HarmonyReasoningParser(),
}


def reasoning_parser_for(name: str) -> ReasoningParser:
    """The parser called `name`; ValueError naming the choices for any other name."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        choices = ", ".join(REASONING_PARSERS)
        raise ValueError(f"unknown reasoning parser {name!r}; choose one of: {choices}") from None
