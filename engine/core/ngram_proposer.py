"""Drafts by prompt lookup: the tokens that followed the sequence's latest n-gram the last
time it occurred in the sequence itself (its prompt or its own output). Code edits, quoted
documents and tool-call arguments repeat their prompt, so the drafts are often right; a
sequence that never repeats gets no drafts and costs nothing. Only the sequence's own tokens
are read: never another request's, so no user's text can reach another's drafts."""

from __future__ import annotations

import numpy as np

from officellm.engine.core.speculative_config import SpeculativeConfig

# How far back a lookup reads: the search is linear in it, and a match farther back than a
# long file rarely continues.
MAX_LOOKBACK = 8192


class NgramProposer:
    """Finds drafts for one sequence at a time (the scheduler asks after each step)."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config

    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """Up to min(num_speculative_tokens, max_tokens) drafts following the most recent
        earlier occurrence of the sequence's last n tokens, for the longest n that occurs
        (from prompt_lookup_max down to prompt_lookup_min); [] when none does."""
        k = min(self.config.num_speculative_tokens, max_tokens)
        if k <= 0 or len(token_ids) <= self.config.prompt_lookup_min:
            return []
        tokens = np.asarray(token_ids[-MAX_LOOKBACK:], dtype=np.int64)
        length = len(tokens)
        lo, hi = self.config.prompt_lookup_min, min(self.config.prompt_lookup_max, length - 1)
        # Where the last token occurred before (one pass over the tokens), then how far back
        # each of those occurrences goes on matching the suffix: a step costs a compare per
        # token, whatever the n-gram sizes.
        ends = np.flatnonzero(tokens[:-1] == tokens[-1])
        if not ends.size or hi < lo:
            return []
        matched = np.ones(len(ends), dtype=np.int64)
        alive = np.ones(len(ends), dtype=bool)
        for back in range(1, hi):
            pos = ends - back
            ok = alive & (pos >= 0)
            ok[ok] = tokens[pos[ok]] == tokens[-1 - back]
            alive &= ok
            matched += alive
            if not alive.any():
                break
        for n in range(hi, lo - 1, -1):
            found = np.flatnonzero(matched >= n)
            if found.size:
                start = int(ends[found[-1]]) + 1
                return tokens[start:start + k].tolist()
        return []
