"""Model outputs as the models write them, with what the parsers must read out of them.

An expected call's arguments are a dict when they are valid JSON (compared after json.loads)
and the exact text otherwise (a call cut short, or malformed after its header).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolOutput:
    parser: str
    text: str
    content: str | None
    calls: list[tuple[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class ReasoningOutput:
    parser: str
    text: str
    reasoning: str | None
    content: str | None


_WEATHER_PARIS = {"location": "Paris, France", "unit": "celsius"}
_WEATHER_TOKYO = {"location": "Tokyo, Japan", "unit": "celsius"}
_PARIS_CALL = ('<tool_call>\n{"name": "get_current_weather", "arguments": '
               '{"location": "Paris, France", "unit": "celsius"}}\n</tool_call>')
_TOKYO_CALL = ('<tool_call>\n{"name": "get_current_weather", "arguments": '
               '{"location": "Tokyo, Japan", "unit": "celsius"}}\n</tool_call>')
_PYTHON_DICT_CALL = ("<tool_call>\n{'name': 'get_current_weather', 'arguments': "
                     "{'location': 'Paris, France'}}\n</tool_call>")
_SQL_ARGUMENTS = {
    "query": "SELECT note FROM t WHERE note = '{\"a\": [1]}' AND x < 3 AND y </tool",
    "tags": ["café", "東京", "a\\b", "🎉"],
    "limit": 10,
    "options": {"dry_run": False, "nested": {"k": None, "list": [{"z": 1.5e3}]}},
}

TOOL_OUTPUTS: dict[str, ToolOutput] = {
    "hermes one call": ToolOutput("hermes", _PARIS_CALL, None,
                                  [("get_current_weather", _WEATHER_PARIS)]),
    "hermes two parallel calls": ToolOutput(
        "hermes", f"{_PARIS_CALL}\n{_TOKYO_CALL}", None,
        [("get_current_weather", _WEATHER_PARIS), ("get_current_weather", _WEATHER_TOKYO)]),
    "hermes text before a call": ToolOutput(
        "hermes", f"I'll check the current weather in Paris for you.\n{_PARIS_CALL}",
        "I'll check the current weather in Paris for you.\n",
        [("get_current_weather", _WEATHER_PARIS)]),
    "hermes call without arguments": ToolOutput(
        "hermes", '<tool_call>\n{"name": "get_current_time", "arguments": {}}\n</tool_call>',
        None, [("get_current_time", {})]),
    "hermes arguments with braces, quotes, escapes and unicode in strings": ToolOutput(
        "hermes",
        '<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT note FROM t WHERE '
        'note = \'{\\"a\\": [1]}\' AND x < 3 AND y </tool", "tags": ["café", "東京", '
        '"a\\\\b", "\\ud83c\\udf89"], "limit": 10, "options": {"dry_run": false, "nested": '
        '{"k": null, "list": [{"z": 1.5e3}]}}}}\n</tool_call>',
        None, [("run_sql", _SQL_ARGUMENTS)]),
    "hermes invalid JSON in a block": ToolOutput("hermes", _PYTHON_DICT_CALL, _PYTHON_DICT_CALL),
    "hermes valid call then invalid block": ToolOutput(
        "hermes",
        f'{_PARIS_CALL}\n<tool_call>\n{{"name": "get_current_weather" "arguments": '
        '{"location": "Tokyo"}}\n</tool_call>',
        '\n<tool_call>\n{"name": "get_current_weather" "arguments": {"location": "Tokyo"}}'
        '\n</tool_call>',
        [("get_current_weather", _WEATHER_PARIS)]),
    "hermes unterminated block at the end": ToolOutput(
        "hermes", 'Let me look that up.\n<tool_call>\n{"name": "search_w',
        'Let me look that up.\n<tool_call>\n{"name": "search_w'),
    "hermes call cut short in its arguments": ToolOutput(
        "hermes",
        '<tool_call>\n{"name": "write_file", "arguments": {"path": "notes.txt", '
        '"content": "Meeting at 10',
        None, [("write_file", '{"path": "notes.txt", "content": "Meeting at 10')]),
    "hermes tag mentioned in prose": ToolOutput(
        "hermes", "Wrap each call in <tool_call></tool_call> tags, one per call.",
        "Wrap each call in <tool_call></tool_call> tags, one per call."),
    "hermes plain answer": ToolOutput("hermes", "The capital of France is Paris.",
                                      "The capital of France is Paris."),
    "llama3 with python tag": ToolOutput(
        "llama3_json",
        '<|python_tag|>{"name": "get_current_weather", "parameters": '
        '{"location": "San Francisco, CA", "unit": "fahrenheit"}}',
        None,
        [("get_current_weather", {"location": "San Francisco, CA", "unit": "fahrenheit"})]),
    "llama3 without python tag": ToolOutput(
        "llama3_json",
        '{"name": "get_current_weather", "parameters": {"location": "San Francisco, CA"}}',
        None, [("get_current_weather", {"location": "San Francisco, CA"})]),
    "llama3 several calls separated by semicolons": ToolOutput(
        "llama3_json",
        '{"name": "get_current_weather", "parameters": {"location": "Paris"}}; '
        '{"name": "get_current_weather", "parameters": {"location": "Tokyo"}}; '
        '{"name": "get_time", "parameters": {}}',
        None,
        [("get_current_weather", {"location": "Paris"}),
         ("get_current_weather", {"location": "Tokyo"}), ("get_time", {})]),
    "llama3 calls on separate lines with the arguments key": ToolOutput(
        "llama3_json",
        '\n{"name": "search", "arguments": {"query": "llama 3.2 release"}}\n'
        '{"name": "search", "arguments": {"query": "llama 3.2 \\"vision\\" {1B}"}}\n',
        None,
        [("search", {"query": "llama 3.2 release"}),
         ("search", {"query": 'llama 3.2 "vision" {1B}'})]),
    "llama3 call then text": ToolOutput(
        "llama3_json",
        '{"name": "get_time", "parameters": {"zone": "UTC"}}\nI hope this helps.',
        "I hope this helps.", [("get_time", {"zone": "UTC"})]),
    "llama3 call then an object that is not a call": ToolOutput(
        "llama3_json",
        '{"name": "get_time", "parameters": {}}; {"zone": "UTC"}',
        '{"zone": "UTC"}', [("get_time", {})]),
    "llama3 plain answer": ToolOutput(
        "llama3_json", "It is 64°F and sunny in San Francisco.",
        "It is 64°F and sunny in San Francisco."),
    "llama3 JSON answer that is not a call": ToolOutput(
        "llama3_json", '{"city": "Paris", "temperature": 18}',
        '{"city": "Paris", "temperature": 18}'),
    "llama3 built-in tool code after the python tag": ToolOutput(
        "llama3_json", '<|python_tag|>brave_search.call(query="weather in Paris")',
        '<|python_tag|>brave_search.call(query="weather in Paris")'),
    "llama3 call cut short in its arguments": ToolOutput(
        "llama3_json", '<|python_tag|>{"name": "search", "parameters": {"query": "best pi',
        None, [("search", '{"query": "best pi')]),
}

REASONING_OUTPUTS: dict[str, ReasoningOutput] = {
    "qwen3 thinking then answer": ReasoningOutput(
        "qwen3",
        "<think>\nOkay, the user wants 17 times 23. 17*20 = 340 and 17*3 = 51.\n\n"
        "So 340 + 51 = 391.\n</think>\n\n17 × 23 = **391**.",
        "Okay, the user wants 17 times 23. 17*20 = 340 and 17*3 = 51.\n\nSo 340 + 51 = 391.",
        "17 × 23 = **391**."),
    "qwen3 without think tags": ReasoningOutput(
        "qwen3", "17 × 23 = **391**.", None, "17 × 23 = **391**."),
    "qwen3 truncated thinking": ReasoningOutput(
        "qwen3", '<think>\nOkay, let me count the r\'s in "strawberry": s, t, r',
        'Okay, let me count the r\'s in "strawberry": s, t, r', None),
    "qwen3 empty thinking": ReasoningOutput(
        "qwen3", "<think>\n\n</think>\n\nHello! How can I help you today?",
        None, "Hello! How can I help you today?"),
    "qwen3 closing tag without an opening one": ReasoningOutput(
        "qwen3", "Close the block with </think> and carry on.", None,
        "Close the block with </think> and carry on."),
    "qwen3 thinking then a tool call": ReasoningOutput(
        "qwen3", f"<think>\nThe user wants the weather in Paris; I'll call the tool.\n</think>"
                 f"\n\n{_PARIS_CALL}",
        "The user wants the weather in Paris; I'll call the tool.", _PARIS_CALL),
    "deepseek_r1 thinking then answer": ReasoningOutput(
        "deepseek_r1",
        "Okay, so I need to add 2 and 2. That's 4.\n\nWait, let me double-check: yes.\n"
        "</think>\n\nThe answer is **4**.",
        "Okay, so I need to add 2 and 2. That's 4.\n\nWait, let me double-check: yes.",
        "The answer is **4**."),
    "deepseek_r1 with the opening tag repeated": ReasoningOutput(
        "deepseek_r1", "<think>\nOkay, 2 + 2 is 4.\n</think>\n\nThe answer is 4.",
        "Okay, 2 + 2 is 4.", "The answer is 4."),
    "deepseek_r1 truncated thinking": ReasoningOutput(
        "deepseek_r1", "Okay, the user wants a proof that there are infinitely many primes. "
                       "Euclid's argument: suppose there are finitely many, p1",
        "Okay, the user wants a proof that there are infinitely many primes. "
        "Euclid's argument: suppose there are finitely many, p1", None),
}


@dataclass(frozen=True)
class TurnOutput:
    """A whole turn read by a model's reader, reasoning then calls: gpt-oss's harmony turns,
    where the two parsers take one format apart together (app/chat/harmony.py)."""

    text: str
    reasoning: str | None
    content: str | None
    calls: list[tuple[str, Any]] = field(default_factory=list)


# gpt-oss's turns as its tokens decode with their special tokens kept, the prompt having
# ended with `<|start|>assistant` (shapes from OpenAI's harmony guide and gpt-oss-20b's
# answers; the recipient before the channel and `json` without `<|constrain|>` is how its
# chat template writes an earlier call, which the model also writes back).
_TOKYO_ARGUMENTS = '{"location":"Tokyo, Japan","unit":"celsius"}'
HARMONY_OUTPUTS: dict[str, TurnOutput] = {
    "reasoning then a call": TurnOutput(
        "<|channel|>analysis<|message|>The user asks for the weather in Tokyo. We should call "
        "get_current_weather.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_current_weather <|constrain|>json<|message|>"
        f"{_TOKYO_ARGUMENTS}<|call|>",
        "The user asks for the weather in Tokyo. We should call get_current_weather.", None,
        [("get_current_weather", _WEATHER_TOKYO)]),
    "reasoning then the answer": TurnOutput(
        '<|channel|>analysis<|message|>User asks: "What is 2 + 2?" Simple arithmetic. Provide '
        "answer.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>",
        'User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.', "2 + 2 = 4."),
    "a preamble then a call, the recipient before the channel": TurnOutput(
        "<|channel|>analysis<|message|>Need the file list first.<|end|><|start|>assistant"
        "<|channel|>commentary<|message|>**Plan**: list the files, then read the README."
        "<|end|><|start|>assistant to=functions.list_files<|channel|>commentary json"
        '<|message|>{"path": "."}<|call|>',
        "Need the file list first.", "**Plan**: list the files, then read the README.",
        [("list_files", {"path": "."})]),
    "two calls in one turn": TurnOutput(
        "<|channel|>analysis<|message|>Two cities: call twice.<|end|><|start|>assistant"
        "<|channel|>commentary to=functions.get_current_weather <|constrain|>json<|message|>"
        '{"location":"Paris, France","unit":"celsius"}<|call|><|start|>assistant'
        "<|channel|>commentary to=functions.get_current_weather <|constrain|>json<|message|>"
        f"{_TOKYO_ARGUMENTS}<|call|>",
        "Two cities: call twice.", None,
        [("get_current_weather", _WEATHER_PARIS), ("get_current_weather", _WEATHER_TOKYO)]),
    "a call cut short by max_tokens": TurnOutput(
        "<|channel|>analysis<|message|>Save the note.<|end|><|start|>assistant<|channel|>"
        "commentary to=functions.write_file <|constrain|>json<|message|>"
        '{"path":"notes.txt","content":"Meeting at 10',
        "Save the note.", None,
        [("write_file", '{"path":"notes.txt","content":"Meeting at 10')]),
    "the answer only": TurnOutput(
        "<|channel|>final<|message|>Hello! How can I help you today?<|return|>",
        None, "Hello! How can I help you today?"),
    "reasoning cut short": TurnOutput(
        "<|channel|>analysis<|message|>We need to count the r's in strawberry: s, t, r",
        "We need to count the r's in strawberry: s, t, r", None),
    "a header cut short": TurnOutput(
        "<|channel|>analysis<|message|>Answer briefly.<|end|><|start|>assistant<|channel|>fin",
        "Answer briefly.", None),
    "two analysis messages around a built-in tool call": TurnOutput(
        "<|channel|>analysis<|message|>Let me search.<|end|><|start|>assistant<|channel|>"
        'analysis to=browser.search code<|message|>{"query": "café 東京"}<|call|>'
        "<|start|>assistant<|channel|>analysis<|message|>Found it.<|end|><|start|>assistant"
        "<|channel|>final<|message|>The café is in **東京** 🎉.<|return|>",
        'Let me search.\n{"query": "café 東京"}\nFound it.', "The café is in **東京** 🎉."),
    "text that is not harmony": TurnOutput('{"city": "Paris"}', None, '{"city": "Paris"}'),
}
