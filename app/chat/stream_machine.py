"""The state machine every streaming parser of a model's text runs (the hermes, llama3_json and
harmony tool-call streams, the <think> and harmony reasoning streams).

It holds the text not consumed yet; the current state is a step that consumes what it can and
says whether it moved to another state, so the next state gets its turn at once. A parser
names its first state and how the pieces it found become one delta (`_take`); its states do
the rest.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from officellm.app.chat.tag_split import split_at_first_tag, split_at_tag

Delta = TypeVar("Delta")
Step = Callable[[], bool]


class StreamStateMachine(ABC, Generic[Delta]):
    """One streamed output's parse, fed its text deltas in order; each call answers what the
    text so far adds (text that may still turn out to be part of a tag is held back)."""

    def __init__(self, first: Step) -> None:
        self._buf = ""  # the text not consumed yet
        self._final = False  # no more text will come: nothing is held back any more
        self._step = first

    def feed(self, delta_text: str) -> Delta:
        """What `delta_text` adds."""
        self._buf += delta_text
        return self._run()

    def finish(self) -> Delta:
        """The text held back at the end."""
        self._final = True
        return self._run()

    @abstractmethod
    def _take(self) -> Delta:
        """What the states found since the last call, as one delta (and forget it)."""

    def _run(self) -> Delta:
        while self._step():
            pass
        return self._take()

    def _go(self, step: Step) -> bool:
        """Move to `step`; True, so the loop runs it at once."""
        self._step = step
        return True

    def _until(self, tag: str) -> tuple[str, bool]:
        """Consume the text before `tag` (all of it but a possible start of the tag, unless
        final) and the tag itself when found: (the text before it, found)."""
        before, self._buf, found = split_at_tag(self._buf, tag, self._final)
        return before, found

    def _until_any(self, tags: Sequence[str]) -> tuple[str, str | None]:
        """`_until` for whichever of `tags` comes first: (the text before it, the tag found
        or None)."""
        before, self._buf, found = split_at_first_tag(self._buf, tags, self._final)
        return before, found
