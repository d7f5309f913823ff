"""<think> reasoning: qwen3 (the output opens the tag) and deepseek_r1 (the prompt opened it)."""

from __future__ import annotations

import pytest

from officellm.app.chat.reasoning_parsers import (
    REASONING_PARSERS,
    ParsedReasoning,
    ReasoningDelta,
    reasoning_parser_for,
)

QWEN3 = REASONING_PARSERS["qwen3"]
R1 = REASONING_PARSERS["deepseek_r1"]


def test_qwen3_reasoning_is_the_think_block_and_content_the_rest() -> None:
    assert QWEN3.parse("<think>\nhmm\n</think>\n\nHi") == ParsedReasoning("hmm", "Hi")


def test_qwen3_output_without_an_opening_tag_is_all_content() -> None:
    text = "Hi, so </think> is a tag."
    assert QWEN3.parse(text) == ParsedReasoning(None, text)


def test_deepseek_r1_output_is_reasoning_until_the_closing_tag() -> None:
    assert R1.parse("hmm\n</think>\n\nHi") == ParsedReasoning("hmm", "Hi")


def test_deepseek_r1_tolerates_the_opening_tag_repeated() -> None:
    assert R1.parse("<think>\nhmm\n</think>\n\nHi") == ParsedReasoning("hmm", "Hi")


@pytest.mark.parametrize("parser", [QWEN3, R1], ids=["qwen3", "deepseek_r1"])
def test_thinking_cut_short_is_all_reasoning(parser) -> None:
    assert parser.parse("<think>\nLet me see, fir") == ParsedReasoning("Let me see, fir", None)


@pytest.mark.parametrize("parser", [QWEN3, R1], ids=["qwen3", "deepseek_r1"])
def test_newlines_around_reasoning_and_opening_the_content_are_dropped(parser) -> None:
    parsed = parser.parse("<think>\n\na\n\nb\n\n</think>\n\n\nc\n\nd\n")
    assert parsed == ParsedReasoning("a\n\nb", "c\n\nd\n")


@pytest.mark.parametrize("parser", [QWEN3, R1], ids=["qwen3", "deepseek_r1"])
def test_empty_parts_are_none(parser) -> None:
    assert parser.parse("<think>\n\n</think>\n\n") == ParsedReasoning(None, None)


def test_reasoning_streams_before_the_closing_tag_arrives() -> None:
    stream = QWEN3.stream()
    assert stream.feed("<think>\nStep one") == ReasoningDelta("Step one", "")
    assert stream.feed(", step two") == ReasoningDelta(", step two", "")


@pytest.mark.parametrize("cut", range(1, len("</think>")))
def test_a_closing_tag_split_across_deltas_never_leaks(cut: int) -> None:
    stream = QWEN3.stream()
    tag = "</think>"
    deltas = [stream.feed(p) for p in ["<think>ok", tag[:cut], tag[cut:], "\n\nDone"]]
    assert "".join(d.reasoning for d in deltas) == "ok"
    assert "".join(d.content for d in deltas) == "Done"


@pytest.mark.parametrize("cut", range(1, len("<think>")))
def test_an_opening_tag_split_across_deltas_is_recognised(cut: int) -> None:
    stream = QWEN3.stream()
    assert stream.feed("<think>"[:cut]) == ReasoningDelta("", "")
    assert stream.feed("<think>"[cut:] + "x") == ReasoningDelta("x", "")


def test_newlines_inside_reasoning_wait_for_more_reasoning() -> None:
    stream = QWEN3.stream()
    assert stream.feed("<think>\na\n\n") == ReasoningDelta("a", "")
    assert stream.feed("b\n") == ReasoningDelta("\n\nb", "")
    assert stream.feed("</think>\n\nc") == ReasoningDelta("", "c")


def test_a_held_back_partial_tag_is_flushed_at_the_end() -> None:
    stream = R1.stream()
    assert stream.feed("a </thi") == ReasoningDelta("a ", "")
    assert stream.finish() == ReasoningDelta("</thi", "")


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1"])
def test_reasoning_parsers_are_found_by_name(name: str) -> None:
    assert reasoning_parser_for(name) is REASONING_PARSERS[name]


def test_an_unknown_reasoning_parser_name_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="'qwq'.*qwen3, deepseek_r1"):
        reasoning_parser_for("qwq")
