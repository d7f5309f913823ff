"""Logprobs in OpenAI's two formats (chat and completions), with token strings and bytes."""

from __future__ import annotations

from officellm.app.models.token_text import TokenText
from officellm.app.openai.answers import ChatTokenLogprob, CompletionLogprobs, TopLogprob
from officellm.engine import Logprob


def _top(entry: dict[int, Logprob], k: int) -> list[tuple[int, Logprob]]:
    return sorted(((t, lp) for t, lp in entry.items() if lp.rank <= k), key=lambda x: x[1].rank)


def chat_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]], k: int,
                  texts: TokenText) -> list[ChatTokenLogprob]:
    """`choices[i].logprobs.content` items for the given tokens."""
    content = []
    for tid, entry in zip(token_ids, entries, strict=False):
        text, raw = texts.get(tid)
        chosen = entry.get(tid)
        top = []
        for t, lp in _top(entry, k):
            t_text, t_raw = texts.get(t)
            top.append(TopLogprob(token=t_text, logprob=lp.logprob, bytes=t_raw))
        content.append(ChatTokenLogprob(token=text, logprob=chosen.logprob if chosen else None,
                                        bytes=raw, top_logprobs=top))
    return content


def completion_logprobs(token_ids: list[int], entries: list[dict[int, Logprob] | None], k: int,
                        texts: TokenText, offset: int) -> CompletionLogprobs:
    """A completions `logprobs` object; text offsets count from `offset` characters. An
    entry of None (an echoed prompt's first token) gives null logprobs."""
    tokens, token_lps, offsets = [], [], []
    tops: list[dict[str, float] | None] = []
    for tid, entry in zip(token_ids, entries, strict=False):
        text, _ = texts.get(tid)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            token_lps.append(None)
            tops.append(None)
            continue
        chosen = entry.get(tid)
        token_lps.append(chosen.logprob if chosen else None)
        top = {texts.get(t)[0]: lp.logprob for t, lp in _top(entry, k)}
        if chosen is not None:
            top.setdefault(text, chosen.logprob)
        tops.append(top)
    return CompletionLogprobs(tokens=tokens, token_logprobs=token_lps, top_logprobs=tops,
                              text_offset=offsets)


def joined(first: CompletionLogprobs, then: CompletionLogprobs) -> CompletionLogprobs:
    """`first`'s tokens, then `then`'s: an echoed prompt's logprobs, then the answer's."""
    return CompletionLogprobs(tokens=first.tokens + then.tokens,
                              token_logprobs=first.token_logprobs + then.token_logprobs,
                              top_logprobs=first.top_logprobs + then.top_logprobs,
                              text_offset=first.text_offset + then.text_offset)
