"""A JSON function call, `{"name": "...", "arguments": {...}}`, read from the front.

Text is a call when its header, everything up to the arguments object's opening brace, is well
formed. A stream sends the call's name there and cannot take it back, so whole outputs are
judged by the same rule: nothing after a good header turns a call back into content.

A call's arguments are the model's own text of the arguments object, up to where its braces
balance (strings and escapes followed, the grammar not checked). That text streams as it is
written, nothing held back, and the streamed and whole parses agree to the character, where
re-serializing the parsed value (json.dumps) would need the whole value before sending any.
Arguments cut short or malformed are passed on as written, as OpenAI passes on a call cut
short by max_tokens. Whatever follows the arguments inside the call object is not read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

WHITESPACE = " \t\r\n"  # JSON's


class Unmatched(Enum):
    """Why text is not (yet) a call header."""

    NEED_MORE = "the text so far could still become a header"
    NOT_A_CALL = "no continuation of the text makes it a header"


@dataclass(frozen=True)
class CallHeader:
    """A well-formed `{"name": <string>, "<arguments key>": {` at the start of the text."""

    name: str
    arguments_at: int  # index of the arguments object's "{"


@dataclass(frozen=True)
class ReadCall:
    """A call read from the start of a text."""

    name: str
    arguments: str
    end: int  # index just past the call object, or the text's length if it never closes


class _NeedMore(Exception):
    pass


class _NotACall(Exception):
    pass


class _Reader:
    """Reads header tokens from the front, raising as soon as the outcome is known."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def literal(self, *options: str) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in WHITESPACE:
            self.pos += 1
        rest = self.text[self.pos:]
        for option in options:
            if rest.startswith(option):
                self.pos += len(option)
                return
        if any(option.startswith(rest) for option in options):
            raise _NeedMore
        raise _NotACall

    def string(self) -> str:
        self.literal('"')
        start, i = self.pos - 1, self.pos
        while i < len(self.text) and self.text[i] != '"':
            i += 2 if self.text[i] == "\\" else 1
        if i >= len(self.text):
            raise _NeedMore
        self.pos = i + 1
        try:
            return json.loads(self.text[start:self.pos])
        except ValueError:
            raise _NotACall from None


def match_header(text: str, argument_keys: tuple[str, ...]) -> CallHeader | Unmatched:
    """The call header at the start of `text` (JSON whitespace allowed around its tokens), or
    why there is none: the name must come first and be a non-empty string, then one of
    `argument_keys` with an object value."""
    reader = _Reader(text)
    try:
        reader.literal("{")
        reader.literal('"name"')
        reader.literal(":")
        name = reader.string()
        if not name:
            raise _NotACall
        reader.literal(",")
        reader.literal(*(f'"{key}"' for key in argument_keys))
        reader.literal(":")
        reader.literal("{")
    except _NeedMore:
        return Unmatched.NEED_MORE
    except _NotACall:
        return Unmatched.NOT_A_CALL
    return CallHeader(name, reader.pos - 1)


class ObjectScanner:
    """Finds where a JSON object closes, fed its text in pieces."""

    def __init__(self, depth: int = 0) -> None:
        self._depth = depth  # 1 to find the end of an object already opened
        self._in_string = False
        self._escaped = False

    def feed(self, text: str) -> int | None:
        """The index in `text` just past the brace that closes the object, or None."""
        for i, ch in enumerate(text):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        return None


def read_call(text: str, argument_keys: tuple[str, ...]) -> ReadCall | None:
    """The call at the start of a whole `text`, or None when it has no complete header."""
    header = match_header(text, argument_keys)
    if not isinstance(header, CallHeader):
        return None
    at = header.arguments_at
    closed = ObjectScanner().feed(text[at:])
    if closed is None:  # cut short: the arguments are what was written
        return ReadCall(header.name, text[at:], len(text))
    outer = ObjectScanner(depth=1).feed(text[at + closed:])
    end = len(text) if outer is None else at + closed + outer
    return ReadCall(header.name, text[at:at + closed], end)
