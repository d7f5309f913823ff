"""A forced freeform call (app/chat/tool_parsers/whole_answer.py): the whole answer is one
call's input, read whole or streamed to the same call."""

from __future__ import annotations

import json

from officellm.app.chat.tool_parsers.whole_answer import WholeAnswerCallParser
from tests.openai_parsers.streams import assemble_tool_deltas, chunkings, tool_deltas

PARSER = WholeAnswerCallParser("apply_patch")
ANSWER = '*** Begin Patch\n+"quoted" \\ tab\t é\n*** End Patch'


def test_the_whole_answer_is_the_input_of_one_call_and_nothing_is_content():
    parsed = PARSER.parse(ANSWER)
    (call,) = parsed.tool_calls
    assert parsed.content is None
    assert (call.name, json.loads(call.arguments)) == ("apply_patch", {"input": ANSWER})


def test_a_streamed_answer_assembles_to_the_same_call():
    whole = PARSER.parse(ANSWER).tool_calls[0]
    for chunks in chunkings(ANSWER):
        parsed = assemble_tool_deltas(tool_deltas(PARSER, chunks))
        (call,) = parsed.tool_calls
        assert (call.name, call.arguments) == (whole.name, whole.arguments), chunks


def test_an_empty_answer_is_a_call_with_empty_input():
    (call,) = assemble_tool_deltas(tool_deltas(PARSER, [""])).tool_calls
    assert json.loads(call.arguments) == {"input": ""}
