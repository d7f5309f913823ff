"""The run's bounds: a number of requests and/or a deadline, shared by all simulated users."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field


@dataclass
class Budget:
    """Hands out request slots until `requests` are taken or `duration` seconds have passed.

    Shared by every user coroutine (one event loop, so no lock is needed).
    """

    requests: int | None
    duration: float | None
    started: float = field(default_factory=time.perf_counter)
    taken: int = 0

    def __post_init__(self) -> None:
        if self.requests is None and self.duration is None:
            raise ValueError("give a number of requests or a duration (or both)")

    @property
    def deadline(self) -> float | None:
        return None if self.duration is None else self.started + self.duration

    def remaining_time(self) -> float:
        d = self.deadline
        return float("inf") if d is None else max(0.0, d - time.perf_counter())

    def exhausted(self) -> bool:
        if self.requests is not None and self.taken >= self.requests:
            return True
        return self.remaining_time() <= 0.0

    def take(self) -> bool:
        """Claim one request slot; False once the run is over."""
        if self.exhausted():
            return False
        self.taken += 1
        return True

    async def sleep(self, seconds: float) -> None:
        """Think time, cut short by the deadline (nobody thinks past the end of the run)."""
        await asyncio.sleep(max(0.0, min(seconds, self.remaining_time())))
