"""A streamed Responses API reply (app/openai/responses_output.py): its events build, in
order, exactly the items of the whole reply, however the model's text arrives; a reasoning
model's thinking and a model's tool calls included (the bundled model writes neither)."""

from __future__ import annotations

import json

import pytest

from officellm.app.chat.chat_output import ChatOutputReader
from officellm.app.chat.reasoning_parsers import reasoning_parser_for
from officellm.app.chat.tool_parsers import TOOL_CALL_PARSERS
from officellm.app.chat.tool_parsers.whole_answer import WholeAnswerCallParser
from officellm.app.openai.responses_api_models import (
    InputTokensDetails,
    OutputTokensDetails,
    PlainTextFormat,
    ReasoningEcho,
    ResponseLifecycleEvent,
    ResponseObject,
    ResponseUsage,
    TextConfigEcho,
)
from officellm.app.openai.responses_output import ResponseEventWriter, output_items
from officellm.app.openai.responses_protocol import ToolNames
from tests.openai_parsers.streams import chunkings

READER = ChatOutputReader(reasoning_parser_for("qwen3"), TOOL_CALL_PARSERS["hermes"])
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
TEXTS = {
    "text": "Paris is the capital of France.",
    "reasoning_then_text": "<think>The capital...</think>Paris.",
    "text_then_call": f"Let me add. {CALL}",
    "reasoning_then_calls": f"<think>Two calls.</think>{CALL}\n{CALL}",
}
USAGE = ResponseUsage(input_tokens=5, input_tokens_details=InputTokensDetails(cached_tokens=0),
                      output_tokens=7, output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
                      total_tokens=12)


def in_progress() -> ResponseObject:
    return ResponseObject(
        id="resp_test", created_at=0, status="in_progress", instructions=None,
        max_output_tokens=None, model="m", output=[], parallel_tool_calls=True,
        reasoning=ReasoningEcho(effort=None, summary=None), temperature=0.0,
        text=TextConfigEcho(format=PlainTextFormat(type="text"), verbosity=None),
        tool_choice="auto", tools=[], top_p=1.0, user=None, metadata={})


def stream_events(chunks: list[str], finish_reason: str = "stop") -> list:
    writer = ResponseEventWriter(in_progress())
    stream = READER.stream()
    events = writer.start()
    for chunk in chunks:
        events += writer.feed(stream.feed(chunk))
    events += writer.feed(stream.finish())
    return events + writer.finish(finish_reason, USAGE)


def without_ids(items: list) -> list[dict]:
    return [item.model_dump(exclude={"id", "call_id"}) for item in items]


@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
def test_the_streamed_items_are_the_whole_replys_items(text: str) -> None:
    whole = without_ids(output_items(READER.message(text), incomplete=False))
    for chunks in chunkings(text):
        final = stream_events(chunks)[-1]
        assert final.type == "response.completed"
        assert without_ids(final.response.output) == whole, chunks


@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
def test_the_deltas_of_each_item_assemble_to_its_done_item(text: str) -> None:
    events = stream_events(list(text))
    assembled: dict[str, str] = {}
    for e in events:
        if e.type.endswith(".delta"):
            assembled[e.item_id] = assembled.get(e.item_id, "") + e.delta
    for e in events:
        if e.type == "response.output_item.done":
            item = e.item
            written = item.arguments if item.type == "function_call" else item.content[0].text
            assert assembled.get(item.id, "") == written


def test_events_are_numbered_in_order_and_each_item_is_added_before_it_is_written() -> None:
    events = stream_events(list(TEXTS["reasoning_then_calls"]))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    added: set[str] = set()
    done: set[str] = set()
    for e in events:
        if e.type == "response.output_item.added":
            added.add(e.item.id)
        elif e.type == "response.output_item.done":
            done.add(e.item.id)
        elif not isinstance(e, ResponseLifecycleEvent):
            assert e.item_id in added and e.item_id not in done, e.type
    assert added == done and len(added) == 3


def test_a_cut_reply_ends_incomplete_with_its_last_item_incomplete() -> None:
    final = stream_events(["<think>Long thought"], finish_reason="length")[-1]
    assert final.type == "response.incomplete"
    assert final.response.incomplete_details.reason == "max_output_tokens"
    assert [i.status for i in final.response.output] == ["incomplete"]
    whole = output_items(READER.message("<think>Long thought"), incomplete=True)
    assert without_ids(final.response.output) == without_ids(whole)


def test_a_reply_with_nothing_in_it_is_one_empty_message() -> None:
    final = stream_events([""])[-1]
    assert without_ids(final.response.output) == without_ids(
        output_items(READER.message(""), incomplete=False))
    assert [(i.type, i.content[0].text) for i in final.response.output] == [("message", "")]


def test_a_heartbeat_is_an_in_progress_event_in_sequence_that_changes_no_item() -> None:
    from openai.types.responses import ResponseInProgressEvent

    writer = ResponseEventWriter(in_progress())
    stream = READER.stream()
    events = [*writer.start()]
    beats = writer.heartbeat()
    events += [*beats, *writer.feed(stream.feed("Paris."))]
    beats += writer.heartbeat()
    events += [*beats[1:], *writer.feed(stream.finish()), *writer.finish("stop", USAGE)]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for beat in beats:
        assert ResponseInProgressEvent.model_validate(beat.model_dump()).response.status == \
            "in_progress"
    assert without_ids(events[-1].response.output) == without_ids(
        output_items(READER.message("Paris."), incomplete=False))


# -- custom (freeform) tools: a call's input streams raw, however its arguments arrive --------

PATCH = '*** Begin Patch\n+say "hi" \\ é 😀\n*** End Patch\n'
CUSTOM = ToolNames(custom=frozenset({"apply_patch"}))
CUSTOM_CALLS = {
    # Called of the model's own accord: JSON arguments in its tool format.
    "hermes": (READER, '<tool_call>\n{"name": "apply_patch", "arguments": '
               + json.dumps({"input": PATCH}) + '}\n</tool_call>'),
    # tool_choice naming it: the whole answer is the input.
    "whole_answer": (ChatOutputReader(None, WholeAnswerCallParser("apply_patch")), PATCH),
}


def custom_events(reader: ChatOutputReader, chunks: list[str]) -> list:
    writer = ResponseEventWriter(in_progress(), CUSTOM)
    stream = reader.stream()
    events = writer.start()
    for chunk in chunks:
        events += writer.feed(stream.feed(chunk))
    events += writer.feed(stream.finish())
    return events + writer.finish("stop", USAGE)


@pytest.mark.parametrize("how", CUSTOM_CALLS, ids=CUSTOM_CALLS.keys())
def test_a_custom_calls_input_deltas_assemble_to_its_raw_input(how: str) -> None:
    from openai.types.responses import ResponseCustomToolCallInputDoneEvent

    reader, text = CUSTOM_CALLS[how]
    for chunks in chunkings(text):
        events = custom_events(reader, chunks)
        deltas = "".join(e.delta for e in events
                         if e.type == "response.custom_tool_call_input.delta")
        (done,) = [e for e in events if e.type == "response.custom_tool_call_input.done"]
        ResponseCustomToolCallInputDoneEvent.model_validate(done.model_dump())
        assert deltas == done.input == PATCH, chunks
        (item,) = events[-1].response.output
        assert (item.type, item.input) == ("custom_tool_call", PATCH)
        assert without_ids([item]) == without_ids(
            output_items(reader.message(text), incomplete=False, names=CUSTOM))
