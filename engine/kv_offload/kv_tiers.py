"""The tiers below the pool as one LowerTier (engine/core/lower_tier.py): host RAM first,
then disk. Every block the prefix cache registers goes to both (write-through); a hit is
copied from RAM where the block is there, and read from disk otherwise."""

from __future__ import annotations

from collections.abc import Sequence

from officellm.engine.kv_offload.disk_tier import DiskTier
from officellm.engine.kv_offload.host_tier import HostTier


class KVTiers:
    """A host tier, a disk tier, or both, under the pool."""

    def __init__(self, host: HostTier | None, disk: DiskTier | None) -> None:
        if host is None and disk is None:
            raise ValueError("KVTiers needs a host tier, a disk tier or both")
        self.host = host
        self.disk = disk

    # -- LowerTier -----------------------------------------------------------------------
    def holds(self, key: bytes) -> bool:
        """See LowerTier."""
        return ((self.host is not None and self.host.holds(key))
                or (self.disk is not None and self.disk.holds(key)))

    def fetch(self, request_id: str, keys: Sequence[bytes]) -> list[memoryview | None] | None:
        """See LowerTier: blocks in RAM at once, the rest once the disk has read them."""
        found: dict[bytes, memoryview] = {}
        if self.host is not None:
            for key in keys:
                view = self.host.view(key)
                if view is not None:
                    found[key] = view
        rest = [key for key in keys if key not in found]
        if rest and self.disk is not None:
            read = self.disk.fetch(request_id, rest)
            if read is None:
                return None
            found.update((k, p) for k, p in zip(rest, read, strict=True) if p is not None)
        return [found.get(key) for key in keys]

    def read_seconds(self, keys: Sequence[bytes]) -> float | None:
        """See LowerTier: the copies from RAM and the reads from disk, one after the other."""
        in_host = sum(1 for k in keys if self.host is not None and self.host.holds(k))
        total = 0.0
        for seconds, count in ((self.host.copy_seconds(in_host) if self.host else None, in_host),
                               (self.disk.read_seconds(len(keys) - in_host) if self.disk
                                else None, len(keys) - in_host)):
            if count:
                if seconds is None:
                    return None
                total += seconds
        return total

    def release(self, request_id: str) -> None:
        """See LowerTier."""
        if self.disk is not None:
            self.disk.release(request_id)

    # -- the engine's --------------------------------------------------------------------
    def put(self, key: bytes, cache_salt: str | None, payload: bytes) -> None:
        """Keep a block the step computed in every tier."""
        if self.host is not None:
            self.host.put(key, cache_salt, payload)
        if self.disk is not None:
            self.disk.put(key, cache_salt, payload)

    def reading(self) -> bool:
        """Whether some waiting request's blocks are still being read from disk."""
        return self.disk is not None and self.disk.reading()

    def wait_for_reads(self, timeout: float) -> None:
        """Block until a disk read finishes (or `timeout` seconds pass)."""
        if self.disk is not None:
            self.disk.wait_for_reads(timeout)

    def purge(self, cache_salt: str | None) -> None:
        """Forget every block kept under this prefix-cache salt, in every tier."""
        if self.host is not None:
            self.host.purge(cache_salt)
        if self.disk is not None:
            self.disk.purge(cache_salt)

    def close(self) -> None:
        """Write what the disk tier has queued, and stop its threads."""
        if self.disk is not None:
            self.disk.close()
