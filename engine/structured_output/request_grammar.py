"""One sequence's position in its grammar: the matcher that says which tokens may come next.

xgrammar is imported where it is first used: it pulls in transformers (0.6 s), which an
engine that never sees a structured-output request need not pay for at start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    import xgrammar as xgr


class RequestGrammar:
    """An xgrammar matcher for one sequence, advanced by every token the sequence accepts.

    Invariant: the matcher has accepted exactly the sequence's output tokens, so its bitmask
    is the one for the next token. `sync` restores it after the output was changed without
    the matcher (preemption keeps the output today, but recomputation must never depend on
    that staying so).
    """

    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self._compiled = compiled
        self._matcher = xgr.GrammarMatcher(compiled)
        self._accepted: list[int] = []

    @property
    def is_terminated(self) -> bool:
        """The grammar accepted a stop token: nothing may follow."""
        return self._matcher.is_terminated()

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False if the grammar does not allow it (the matcher
        is then unchanged)."""
        if not self._matcher.accept_token(token_id):
            return False
        self._accepted.append(token_id)
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (xgrammar's packed int32)."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def sync(self, output_token_ids: list[int]) -> None:
        """Make the matcher's history equal `output_token_ids`: roll back what it accepted
        beyond their common prefix and replay the rest (rebuilding if rollback cannot)."""
        common = 0
        for mine, theirs in zip(self._accepted, output_token_ids):
            if mine != theirs:
                break
            common += 1
        extra = len(self._accepted) - common
        if extra == 0 and common == len(output_token_ids):
            return
        if extra:
            self._matcher = self._xgr.GrammarMatcher(self._compiled)  # unlimited rollback is costly
            self._accepted = []
            common = 0
        for token in output_token_ids[common:]:
            self.accept(token)
