"""Finding a tag in streamed text, where any delta may end in the middle of the tag."""

from __future__ import annotations

from collections.abc import Sequence


def split_at_tag(text: str, tag: str, final: bool) -> tuple[str, str, bool]:
    """Splits `text` at the first `tag`: (before, after, found).

    Without the tag, `before` is the text that can no longer be part of one and `after` the
    suffix that might still be its beginning (held back for the next delta), unless `final`
    says no more text will come.
    """
    before, after, found = split_at_first_tag(text, (tag,), final)
    return before, after, found is not None


def split_at_first_tag(text: str, tags: Sequence[str], final: bool
                       ) -> tuple[str, str, str | None]:
    """Splits `text` at the earliest of `tags`: (before, after, the tag found or None), with
    split_at_tag's rule for a suffix that might still become any of them."""
    found = [(at, tag) for tag in tags if (at := text.find(tag)) >= 0]
    if found:
        at, tag = min(found, key=lambda f: (f[0], -len(f[1])))
        return text[:at], text[at + len(tag):], tag
    if final:
        return text, "", None
    held = max((n for tag in tags for n in range(min(len(tag) - 1, len(text)), 0, -1)
                if text.endswith(tag[:n])), default=0)
    return (text[:-held], text[-held:], None) if held else (text, "", None)
