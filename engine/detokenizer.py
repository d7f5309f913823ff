"""Incremental detokenization with stop strings, never emitting a broken UTF-8 character."""

from __future__ import annotations

from typing import Any

# Prompt tokens decoded in front of the output, so the first output token gets its
# leading space right in tokenizers (SentencePiece) that drop it at the start of a text.
_PREFIX_WINDOW = 5
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns one sequence's output ids into text, a little at a time.

    Text is decoded over a sliding window (the vLLM method): a token that ends inside a
    multi-byte character decodes to U+FFFD and is held until the character completes. Text
    that could be the start of a stop string is held back until it is known not to be one.
    """

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], stop: list[str],
                 skip_special_tokens: bool = True, include_stop_str_in_output: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = stop
        self.include_stop = include_stop_str_in_output
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.tokens: list[int] = list(prompt_token_ids[-_PREFIX_WINDOW:])
        self.prefix_offset = 0
        self.read_offset = len(self.tokens)
        self.text = ""
        self.emitted = 0  # characters of self.text already handed out

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add_token(self, token_id: int) -> str | None:
        """Append one token; return the stop string if the text now contains one."""
        self.tokens.append(token_id)
        prefix = self._decode(self.tokens[self.prefix_offset : self.read_offset])
        full = self._decode(self.tokens[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(_REPLACEMENT):
            new = full[len(prefix) :]
            old_len = len(self.text)
            self.text += new
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.tokens)
            return self._check_stop(old_len)
        return None

    def _check_stop(self, old_len: int) -> str | None:
        for s in self.stop:
            start = max(0, old_len - len(s) + 1)
            idx = self.text.find(s, start)
            if idx != -1:
                self.text = self.text[: idx + len(s)] if self.include_stop else self.text[:idx]
                return s
        return None

    def take_delta(self, finished: bool) -> str:
        """Text not yet handed out; while running, hold back what could begin a stop string."""
        end = len(self.text)
        if not finished and self.stop and self.hold:
            end = max(self.emitted, end - self.hold)
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta
