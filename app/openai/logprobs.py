"""Logprobs in OpenAI's two formats (chat and completions), with token strings and bytes."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from app.openai.answers import ChatTokenLogprob, CompletionLogprobs, TopLogprob
from engine import Logprob


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    # GPT-2's byte-level alphabet: each byte is shown as one printable character.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


class TokenText:
    """Token id -> (text, bytes), cached. Only reads the vocabulary, so it may be used off the
    engine thread."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def decode(self, token_ids: list[int]) -> str:
        """Text of a token sequence (for echoing a prompt given as ids)."""
        return self._tok.decode(token_ids)

    def get(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is not None:
            return hit
        piece = self._tok.convert_ids_to_tokens(token_id)
        dec = _byte_decoder()
        if isinstance(piece, str) and piece and all(ch in dec for ch in piece):
            # Byte-level BPE: the token's exact bytes, even for part of a UTF-8 character.
            raw = bytes(dec[ch] for ch in piece)
            text = raw.decode("utf-8", errors="replace")
        else:
            text = self._tok.decode([token_id])
            raw = text.encode("utf-8")
        out = (text, list(raw))
        self._cache[token_id] = out
        return out


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


def completion_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]], k: int,
                        texts: TokenText, offset: int) -> CompletionLogprobs:
    """A completions `logprobs` object; text offsets count from `offset` characters."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for tid, entry in zip(token_ids, entries, strict=False):
        text, _ = texts.get(tid)
        chosen = entry.get(tid)
        tokens.append(text)
        token_lps.append(chosen.logprob if chosen else None)
        top = {texts.get(t)[0]: lp.logprob for t, lp in _top(entry, k)}
        if chosen is not None:
            top.setdefault(text, chosen.logprob)
        tops.append(top)
        offsets.append(offset)
        offset += len(text)
    return CompletionLogprobs(tokens=tokens, token_logprobs=token_lps, top_logprobs=tops,
                              text_offset=offsets)
