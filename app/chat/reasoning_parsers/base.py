"""What a reasoning parser reads out of a model's text, and the interface every parser has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ParsedReasoning:
    """A whole output split into its reasoning and its answer (None for an empty part)."""

    reasoning: str | None
    content: str | None


@dataclass(frozen=True)
class ReasoningDelta:
    """What one piece of streamed text adds to each part ("" for nothing)."""

    reasoning: str
    content: str


class ReasoningStream(Protocol):
    """The parse of one streamed output, fed its text deltas in order."""

    def feed(self, delta_text: str) -> ReasoningDelta:
        """What `delta_text` adds; text that might still be part of a tag is held back."""
        ...

    def finish(self) -> ReasoningDelta:
        """The text held back at the end."""
        ...


class ReasoningParser(Protocol):
    """A model family's way of marking its reasoning, for whole outputs and for streams."""

    def parse(self, text: str) -> ParsedReasoning:
        """The reasoning and content of a whole output."""
        ...

    def stream(self) -> ReasoningStream:
        """A new stream parse; its deltas assemble to what `parse` gives for the whole text."""
        ...
