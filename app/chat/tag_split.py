"""Finding a tag in streamed text, where any delta may end in the middle of the tag."""

from __future__ import annotations


def split_at_tag(text: str, tag: str, final: bool) -> tuple[str, str, bool]:
    """Splits `text` at the first `tag`: (before, after, found).

    Without the tag, `before` is the text that can no longer be part of one and `after` the
    suffix that might still be its beginning (held back for the next delta), unless `final`
    says no more text will come.
    """
    at = text.find(tag)
    if at >= 0:
        return text[:at], text[at + len(tag):], True
    if final:
        return text, "", False
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return text[:-n], text[-n:], False
    return text, "", False
