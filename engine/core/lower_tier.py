"""What the KV manager asks of the tiers below the pool (engine/kv_offload/kv_tiers.py:
host RAM, disk): which blocks they hold, and to copy some into pool blocks the manager has
set aside for a waiting request, in the background (as vLLM's offloading connector loads into
blocks the scheduler allocated). The manager does no I/O: the tiers copy into the pool
through the executor, and the blocks the step fills go down to them after it (SchedulerOutput's
kv_saves)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class LowerTier(Protocol):
    """Blocks kept below the pool, by the key the prefix cache gives them."""

    def holds(self, key: bytes) -> bool:
        """Whether the tier has this block (a later read may still find it damaged)."""
        ...

    def fetch(self, request_id: str, keys: Sequence[bytes],
              block_ids: Sequence[int]) -> list[bool] | None:
        """Copy the blocks into these pool blocks (one per key) for a waiting request, in
        the background: None while any is still being copied (the first call starts it),
        then one entry per key, False for a block that could not be read (the tier has
        dropped it, so `holds` says so now)."""
        ...

    def read_seconds(self, keys: Sequence[bytes]) -> float | None:
        """What copying these blocks in is expected to take, as measured (None: not
        measured yet)."""
        ...

    def release(self, request_id: str) -> None:
        """Forget the request's copies (done, or the request gone): once this returns,
        nothing writes into its pool blocks any more."""
        ...


@dataclass(frozen=True, slots=True)
class BlockSave:
    """A pool block the step fills, to be copied to the lower tier after the step ran
    (kept only if the block still holds `key` then: a failed step's blocks lose it)."""

    block_id: int
    key: bytes
    cache_salt: str | None
