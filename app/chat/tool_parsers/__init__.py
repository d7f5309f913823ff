"""Tool call parsers: a model's text turned into OpenAI's `content` and `tool_calls`."""

from officellm.app.chat.tool_parsers.base import (
    ParsedToolOutput,
    StreamDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    ToolCallStream,
)
from officellm.app.chat.tool_parsers.registry import (
    TOOL_CALL_PARSERS,
    detect_tool_call_format,
    parser_for,
)

__all__ = ["TOOL_CALL_PARSERS", "ParsedToolOutput", "StreamDelta", "ToolCall",
           "ToolCallDelta", "ToolCallParser", "ToolCallStream", "detect_tool_call_format",
           "parser_for"]
