"""Incremental detokenization with stop strings, never emitting a broken UTF-8 character."""

from __future__ import annotations

from typing import Any

from tokenizers.decoders import DecodeStream

# Prompt tokens the stream is primed with, so the first output token gets its leading space
# right in tokenizers (SentencePiece) that drop it at the start of a text.
_PREFIX_WINDOW = 5


class IncrementalDetokenizer:
    """Turns one sequence's output ids into text, a little at a time.

    Decoding is the tokenizers library's DecodeStream (one call into Rust per token): a token
    that ends inside a multi-byte character yields nothing until the character completes.
    Text that could be the start of a stop string is held back until it is known not to be
    one, so a stop string is never streamed. Only the text not yet handed out is kept.
    """

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], stop: list[str],
                 skip_special_tokens: bool = True, include_stop_str_in_output: bool = False):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TypeError("The detokenizer needs a fast (Rust) tokenizer; "
                            f"{type(tokenizer).__name__} is not one.")
        self._backend = backend
        self._stream = DecodeStream(list(prompt_token_ids[-_PREFIX_WINDOW:]),
                                    skip_special_tokens=skip_special_tokens)
        self.stop = stop
        self.include_stop = include_stop_str_in_output
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.pending = ""  # decoded, not yet handed out

    def add_token(self, token_id: int, check_stop: bool = True) -> str | None:
        """Append one token; return the stop string if the text now contains one (then the
        text ends at it). `check_stop` False (before min_tokens): stop strings are ignored."""
        piece = self._step(token_id)
        if not piece:
            return None
        old_len = len(self.pending)
        self.pending += piece
        if check_stop and self.stop:
            return self._check_stop(old_len)
        return None

    def _step(self, token_id: int) -> str | None:
        return self._stream.step(self._backend, token_id)

    def _check_stop(self, old_len: int) -> str | None:
        # Held-back text covers any stop string that the new piece completes: a match always
        # starts inside `pending`.
        for s in self.stop:
            start = max(0, old_len - len(s) + 1)
            idx = self.pending.find(s, start)
            if idx != -1:
                self.pending = self.pending[: idx + len(s)] if self.include_stop else self.pending[:idx]
                return s
        return None

    def take_delta(self, finished: bool) -> str:
        """Text not yet handed out; while running, hold back what could begin a stop string."""
        pending = self.pending
        if finished or not self.stop or not self.hold:
            self.pending = ""
            return pending
        cut = max(0, len(pending) - self.hold)
        self.pending = pending[cut:]
        return pending[:cut]
