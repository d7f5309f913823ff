"""The host tier: KV blocks in the machine's RAM below a GPU's pool, within a fixed number
of slots, least recently used out first.

Every full block the prefix cache registers is copied here after the step that filled it
(write-through, as the disk tier; a block the pool then evicts is already here), and a
prefix hit on a block that left the pool is copied back from here instead of computed: a
preempted sequence's blocks included, so preemption costs a copy, not a prefill, wherever
the copy measures cheaper (KVCacheManager._cheaper_to_read).

The slots are one allocation made at start, pinned on CUDA so the copies run at the bus's
speed; nothing is allocated per block. Everything here runs on the engine's thread: a
view handed out stays valid until the next `put`, and KVTiers copies it into its pool block
at once.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np
import torch

from officellm.engine.config import KV_OFFLOADING_AUTO, EngineConfig
from officellm.engine.host_memory import available_memory_bytes
from officellm.engine.stats import HostTierStats


class HostTier:
    """Blocks in host memory, by their prefix-cache key (used by engine/kv_offload/kv_tiers.py)."""

    def __init__(self, capacity_bytes: int, block_bytes: int, pinned: bool) -> None:
        self.block_bytes = block_bytes
        self.num_slots = capacity_bytes // block_bytes
        if self.num_slots < 1:
            raise ValueError(f"the host tier's size ({capacity_bytes} bytes) holds no block "
                             f"of {block_bytes} bytes")
        self.capacity_bytes = self.num_slots * block_bytes
        self.pinned = pinned
        # Pages are touched as slots are first filled: an idle tier costs address space only
        # on the CPU (pinned memory is locked at once).
        self._slab = torch.empty((self.num_slots, block_bytes), dtype=torch.uint8,
                                 pin_memory=pinned).numpy()
        self._slots: OrderedDict[bytes, int] = OrderedDict()  # least recently used first
        self._salts: dict[bytes, str | None] = {}
        self._free = list(range(self.num_slots - 1, -1, -1))
        self._copy_bytes = 0
        self._copy_seconds = 0.0
        self.blocks_stored = self.blocks_read = self.blocks_evicted = 0

    def holds(self, key: bytes) -> bool:
        """Whether the block is here."""
        return key in self._slots

    def view(self, key: bytes) -> memoryview | None:
        """The block's bytes (valid until the next put), marked as used; None if absent."""
        slot = self._slots.get(key)
        if slot is None:
            return None
        self._slots.move_to_end(key)
        self.blocks_read += 1
        return memoryview(self._slab[slot])

    def put(self, key: bytes, cache_salt: str | None, payload: bytes | memoryview) -> None:
        """Keep one block's bytes (a copy), evicting the least recently used if full."""
        if len(payload) != self.block_bytes:
            raise ValueError(f"a block is {self.block_bytes} bytes, not {len(payload)}")
        if key in self._slots:
            self._slots.move_to_end(key)
            return
        if self._free:
            slot = self._free.pop()
        else:
            old, slot = self._slots.popitem(last=False)
            del self._salts[old]
            self.blocks_evicted += 1
        started = time.perf_counter()
        self._slab[slot] = np.frombuffer(payload, dtype=np.uint8)
        self._copy_seconds += time.perf_counter() - started
        self._copy_bytes += self.block_bytes
        self._slots[key] = slot
        self._salts[key] = cache_salt
        self.blocks_stored += 1

    def copy_seconds(self, num_blocks: int) -> float | None:
        """What copying this many blocks is expected to take, at the speed this tier's own
        copies measured (None before the first)."""
        if not self._copy_bytes or self._copy_seconds <= 0:
            return None
        return num_blocks * self.block_bytes * self._copy_seconds / self._copy_bytes

    def purge(self, cache_salt: str | None) -> int:
        """Drop every block kept under this prefix-cache salt; how many."""
        mine = [key for key, salt in self._salts.items() if salt == cache_salt]
        for key in mine:
            self._free.append(self._slots.pop(key))
            del self._salts[key]
            self._slab[self._free[-1]] = 0  # a person's purged context is not left in RAM
        return len(mine)

    def stats(self) -> HostTierStats:
        return HostTierStats(len(self._slots), len(self._slots) * self.block_bytes,
                             self.capacity_bytes, self.blocks_stored, self.blocks_read,
                             self.blocks_evicted, self.pinned)


# kv_offloading_size auto on CUDA: a share of the RAM free at start, up to a cap, so the
# office's other programs (and a second model's tier) keep the rest.
AUTO_RAM_FRACTION = 0.25
AUTO_CAP_BYTES = 16 * 1024**3


def host_tier_bytes(config: EngineConfig) -> int:
    """The host tier's size for this config: kv_offloading_size, with auto resolved by
    device (none on the CPU, whose pool is already in RAM); 0 for none."""
    size = config.kv_offloading_size
    if size is None:
        return 0
    if size == KV_OFFLOADING_AUTO:
        if not config.device.startswith("cuda"):
            return 0
        return int(min(available_memory_bytes() * AUTO_RAM_FRACTION, AUTO_CAP_BYTES))
    return int(size)
