"""A request's reasoning effort as the chat template's `reasoning_effort` argument.

gpt-oss's template writes it into its system message (`Reasoning: low|medium|high`;
medium when not given); templates without it ignore it, as they ignore enable_thinking. The
three APIs' words meet here: Chat Completions' `reasoning_effort` and the Responses API's
`reasoning.effort` (OpenAI's: none, minimal, low, medium, high, xhigh) and Anthropic's
`output_config.effort` (low, medium, high, xhigh, max) or, without it, its thinking switch
and budget. Below low is low (gpt-oss always reasons) and above high is high; a word not
known here leaves the template's default rather than refusing the request, as OpenAI adds
words for its newer models that clients send to any server.
"""

from __future__ import annotations

from typing import Any

TEMPLATE_ARGUMENT = "reasoning_effort"
_LEVELS = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high",
           "xhigh": "high", "max": "high"}
# Anthropic's thinking budget_tokens up to which each level applies; more is high.
_BUDGET_LEVELS = ((4096, "low"), (16384, "medium"))


def effort_kwargs(effort: str | None) -> dict[str, Any]:
    """The template arguments for an API's effort word (none for None or an unknown word)."""
    level = _LEVELS.get(effort) if effort is not None else None
    return {TEMPLATE_ARGUMENT: level} if level is not None else {}


def budget_effort(budget_tokens: int) -> str:
    """The effort word of an Anthropic thinking budget."""
    return next((level for limit, level in _BUDGET_LEVELS if budget_tokens <= limit), "high")
