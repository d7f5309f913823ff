"""A chat reply as Anthropic's content blocks (app/anthropic/message_output.py), whole:
the cases the bundled model does not produce on demand."""

from __future__ import annotations

from officellm.app.anthropic.message_output import content_blocks
from officellm.app.chat.chat_output import ChatMessageParts
from officellm.app.chat.tool_parsers import ToolCall


def test_a_call_cut_short_is_a_tool_use_with_an_empty_input_not_an_error():
    parts = ChatMessageParts(None, None, [ToolCall("call_1", "add", '{"a": 2, "b"')])
    (block,) = content_blocks(parts, show_thinking=True)
    assert (block.type, block.name, block.input) == ("tool_use", "add", {})


def test_a_whole_call_keeps_its_input_and_its_id_in_anthropics_form():
    parts = ChatMessageParts("Adding.", "Two numbers.",
                             [ToolCall("call_ab12", "add", '{"a": 2, "b": 3}')])
    thinking, text, call = content_blocks(parts, show_thinking=False)
    assert (thinking.type, thinking.thinking, text.text) == ("thinking", "", "Adding.")
    assert (call.id, call.input) == ("toolu_ab12", {"a": 2, "b": 3})
