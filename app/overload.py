"""Overload protection: a bounded queue in front of the engine (`--max-waiting-requests`).

Without a bound, a lunch-time burst only makes everyone wait longer: every request is queued,
latency grows without limit and so does the memory of what waits. With it, what the engine
cannot start soon is told at once to come back (429 + Retry-After, which OpenAI clients honour
by retrying), and every request that was accepted still completes.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.errors import APIError


@dataclass
class AdmissionLimit:
    """Counts the engine sequences admitted and not yet ended, against `max_num_seqs` running
    plus `max_waiting` queued. Lives on the event loop (no lock needed): the check and the
    count happen in one synchronous step, so a burst cannot slip past a stale snapshot."""

    max_running: int
    max_waiting: int
    in_system: int = 0

    @property
    def capacity(self) -> int:
        return self.max_running + self.max_waiting

    def try_enter(self, sequences: int) -> bool:
        """Take room for `sequences` (a request's prompts x n); False when the queue is full.

        An idle server admits any one request, however large, so a big `n` is never refused
        forever."""
        if self.in_system and self.in_system + sequences > self.capacity:
            return False
        self.in_system += sequences
        return True

    def leave(self, sequences: int) -> None:
        self.in_system = max(0, self.in_system - sequences)


def queue_full(limit: AdmissionLimit, retry_after_s: int) -> APIError:
    """429 with Retry-After: the waiting queue is full (DESIGN §5: "queue limit")."""
    return APIError(429, f"The server is at capacity ({limit.max_running} requests running and "
                         f"{limit.max_waiting} waiting); retry in {retry_after_s} s.",
                    code="server_overloaded", headers={"Retry-After": str(retry_after_s)})
