"""Reasoning parsers: a reasoning model's text split into `reasoning` and `content`."""

from officellm.app.chat.reasoning_parsers.base import (
    ParsedReasoning,
    ReasoningDelta,
    ReasoningParser,
    ReasoningStream,
)
from officellm.app.chat.reasoning_parsers.registry import REASONING_PARSERS, reasoning_parser_for

__all__ = ["REASONING_PARSERS", "ParsedReasoning", "ReasoningDelta", "ReasoningParser",
           "ReasoningStream", "reasoning_parser_for"]
