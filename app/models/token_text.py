"""Token ids as the client sees them: the text and exact bytes of each token (logprobs carry
both) and the text of a sequence (a completion's echoed prompt)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any


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
