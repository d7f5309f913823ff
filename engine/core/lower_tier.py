"""What the KV manager asks of the tiers below the pool (engine/kv_offload/kv_tiers.py:
host RAM, disk): which blocks they hold, and their bytes, read ahead while the request
waits. The
manager does no I/O: copies between the pool and the tier are the step's (SchedulerOutput's
kv_loads and kv_saves), run by the executor."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class LowerTier(Protocol):
    """Blocks kept below the pool, by the key the prefix cache gives them."""

    def holds(self, key: bytes) -> bool:
        """Whether the tier has this block (a later read may still find it damaged)."""
        ...

    def fetch(self, request_id: str, keys: Sequence[bytes]) -> list[memoryview | None] | None:
        """The blocks' bytes for a waiting request, read in the background: None while any
        is still being read (the first call starts it), then one entry per key, None for a
        block that could not be read (the tier has dropped it, so `holds` says so now)."""
        ...

    def read_seconds(self, keys: Sequence[bytes]) -> float | None:
        """What reading these blocks is expected to take, as measured (None: not measured
        yet)."""
        ...

    def release(self, request_id: str) -> None:
        """Forget what was read for this request (admitted, or gone)."""
        ...


@dataclass(frozen=True, slots=True)
class BlockLoad:
    """Bytes read from a lower tier, to be copied into pool block `block_id` before the
    step's forward reads it."""

    block_id: int
    payload: memoryview


@dataclass(frozen=True, slots=True)
class BlockSave:
    """A pool block the step fills, to be copied to the lower tier after the step ran
    (kept only if the block still holds `key` then: a failed step's blocks lose it)."""

    block_id: int
    key: bytes
    cache_salt: str | None


@dataclass(frozen=True, slots=True)
class StagedBlock:
    """A prefix-cache hit read from a lower tier, not yet in the pool."""

    key: bytes
    payload: memoryview
