"""An embedding model's tokenizer, shared by the request threads and the encoding thread."""

from __future__ import annotations

import threading
from typing import Any


class LockedTokenizer:
    """A Hugging Face tokenizer whose calls take turns: a fast tokenizer's truncation and
    padding are settings of its one Rust object, which each call changes."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.tokenizer)

    def tokenize(self, text: str, max_length: int | None = None) -> list[int]:
        """`text`'s ids, the model's own special tokens included: all of them, or the first
        `max_length` (the closing special token kept, as sentence-transformers truncates)."""
        with self._lock:
            ids = self.tokenizer(text, add_special_tokens=True,
                                 truncation=max_length is not None, max_length=max_length,
                                 verbose=False)["input_ids"]
        return list(ids)

    def pad(self, batch: list[list[int]]) -> dict[str, Any]:
        """The inputs padded to the longest, with their attention mask, as tensors."""
        with self._lock:
            return self.tokenizer.pad({"input_ids": batch}, return_tensors="pt")
