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
        for n in range(min(self.config.prompt_lookup_max, length - 1),
                       self.config.prompt_lookup_min - 1, -1):
            # Windows that start before the suffix itself: an occurrence must have a token
            # after it that is already known.
            windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
            hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
            hits = hits[hits < length - n]
            if hits.size:
                start = int(hits[-1]) + n
                return tokens[start:start + k].tolist()
        return []
