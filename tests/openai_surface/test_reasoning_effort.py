"""Each API's reasoning effort reaches the chat template as its `reasoning_effort` (gpt-oss's
template writes `Reasoning: low|medium|high`), in the template's three words."""

from __future__ import annotations

import pytest

from officellm.app.anthropic.protocol import MessagesRequest
from officellm.app.chat.reasoning_effort import effort_kwargs
from officellm.app.openai.protocol import ChatCompletionRequest
from officellm.app.openai.responses_protocol import ResponsesRequest

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("word", "level"), [
    ("none", "low"), ("minimal", "low"), ("low", "low"), ("medium", "medium"),
    ("high", "high"), ("xhigh", "high"), ("max", "high")])
def test_every_effort_word_is_one_of_the_templates_three(word: str, level: str) -> None:
    assert effort_kwargs(word) == {"reasoning_effort": level}


@pytest.mark.parametrize("word", [None, "turbo"])
def test_no_effort_or_an_unknown_word_leaves_the_templates_default(word) -> None:
    assert effort_kwargs(word) == {}


def test_chat_completions_reasoning_effort_reaches_the_template() -> None:
    body = ChatCompletionRequest(messages=HI, reasoning_effort="high")
    assert body.template_kwargs() == {"reasoning_effort": "high"}


def test_chat_template_kwargs_name_the_argument_outright_and_win() -> None:
    body = ChatCompletionRequest(messages=HI, reasoning_effort="high",
                                 chat_template_kwargs={"reasoning_effort": "low"})
    assert body.template_kwargs() == {"reasoning_effort": "low"}


def test_the_responses_reasoning_effort_reaches_the_template() -> None:
    body = ResponsesRequest(input="hi", reasoning={"effort": "minimal"})
    assert body.template_kwargs() == {"reasoning_effort": "low"}


def _anthropic(**fields) -> dict:
    return MessagesRequest(max_tokens=8, messages=HI, **fields).template_kwargs()


@pytest.mark.parametrize(("budget", "level"), [(1024, "low"), (8000, "medium"),
                                               (32000, "high")])
def test_an_anthropic_thinking_budget_sets_the_effort(budget: int, level: str) -> None:
    kwargs = _anthropic(thinking={"type": "enabled", "budget_tokens": budget})
    assert kwargs == {"enable_thinking": True, "reasoning_effort": level}


def test_anthropic_output_config_effort_wins_over_the_budget() -> None:
    kwargs = _anthropic(thinking={"type": "enabled", "budget_tokens": 1024},
                        output_config={"effort": "max"})
    assert kwargs["reasoning_effort"] == "high"


def test_anthropic_without_thinking_asks_for_the_least_reasoning() -> None:
    assert _anthropic() == {"enable_thinking": False, "reasoning_effort": "low"}


def test_anthropic_adaptive_thinking_leaves_the_templates_default() -> None:
    assert _anthropic(thinking={"type": "adaptive"}) == {"enable_thinking": True}
