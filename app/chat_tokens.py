"""Counting a conversation's prompt tokens for the policy check, off the engine thread.

The engine's tokenizer belongs to the engine thread (a Rust tokenizer used from two threads
at once can fail with "Already borrowed"), so the policy check has its own copy, loaded from
the same model directory on first use and used by one worker thread at a time. The ids it
renders are handed to the engine as the prompt, so a request is tokenized once, not twice.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from engine.llm import apply_chat_template

Message = dict[str, Any]


class ChatTokenizer:
    """The chat template and tokenizer of the served model, for worker threads."""

    def __init__(self, model_dir: Path) -> None:
        self._model_dir = model_dir
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def render(self, messages: list[Message], add_generation_prompt: bool,
               template_kwargs: dict[str, Any]) -> list[int]:
        """Token ids of `messages` as the engine would build them (blocking: a worker thread).

        Raises ValueError when the template refuses the messages (the client's error).
        """
        with self._lock:
            if self._tokenizer is None:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(str(self._model_dir))
            try:
                return apply_chat_template(self._tokenizer, messages, add_generation_prompt,
                                           **template_kwargs)
            except Exception as exc:  # jinja errors (e.g. roles out of order) are the client's
                raise ValueError(
                    f"The chat template could not render these messages: {exc}") from exc


class MeasuredPrompts:
    """A token counter for app.policy.evaluate that remembers the ids of each message list it
    measured, so the list finally chosen (all of it, or what truncation kept) need not be
    rendered again."""

    def __init__(self, tokenizer: ChatTokenizer, add_generation_prompt: bool,
                 template_kwargs: dict[str, Any]) -> None:
        self._tokenizer = tokenizer
        self._add_generation_prompt = add_generation_prompt
        self._template_kwargs = template_kwargs
        # Keyed by the identity of the message dicts: drop_turns() keeps the same dict objects,
        # and the lists stay alive in the values, so an id is never reused while cached.
        self._ids: dict[tuple[int, ...], tuple[list[Message], list[int]]] = {}

    def __call__(self, messages: list[Message]) -> int:
        return len(self.ids(messages))

    def ids(self, messages: list[Message]) -> list[int]:
        key = tuple(id(m) for m in messages)
        hit = self._ids.get(key)
        if hit is None:
            hit = (messages, self._tokenizer.render(messages, self._add_generation_prompt,
                                                    self._template_kwargs))
            self._ids[key] = hit
        return hit[1]

    def known(self, messages: list[Message]) -> list[int] | None:
        """The ids of `messages` if already measured, else None."""
        hit = self._ids.get(tuple(id(m) for m in messages))
        return hit[1] if hit is not None else None
