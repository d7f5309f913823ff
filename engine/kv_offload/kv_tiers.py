"""The tiers below the pool as one LowerTier (engine/core/lower_tier.py): host RAM first,
then disk. Every block the prefix cache registers goes to both (write-through); a hit is
copied into its pool block from RAM at once where the block is there, and read from disk
into it by the disk tier's threads otherwise."""

from __future__ import annotations

from collections.abc import Sequence

from officellm.engine.kv_offload.disk_tier import DiskTier, PlaceBlocks
from officellm.engine.kv_offload.host_tier import HostTier


class KVTiers:
    """A host tier, a disk tier, or both, under the pool."""

    def __init__(self, host: HostTier | None, disk: DiskTier | None,
                 place: PlaceBlocks) -> None:
        if host is None and disk is None:
            raise ValueError("KVTiers needs a host tier, a disk tier or both")
        self.host = host
        self.disk = disk
        self._place = place
        # Per waiting request, the blocks copied from RAM at its first fetch.
        self._from_host: dict[str, dict[bytes, bool]] = {}

    # -- LowerTier -----------------------------------------------------------------------
    def holds(self, key: bytes) -> bool:
        """See LowerTier."""
        return ((self.host is not None and self.host.holds(key))
                or (self.disk is not None and self.disk.holds(key)))

    def fetch(self, request_id: str, keys: Sequence[bytes],
              block_ids: Sequence[int]) -> list[bool] | None:
        """See LowerTier: blocks in RAM are copied at the first call, the rest read from
        disk by its threads."""
        copied = self._from_host.get(request_id)
        if copied is None:
            copied = self._from_host[request_id] = self._copy_from_host(keys, block_ids)
        rest = [(key, block) for key, block in zip(keys, block_ids, strict=True)
                if key not in copied]
        read: dict[bytes, bool] = {}
        if rest and self.disk is not None:
            done = self.disk.fetch(request_id, [k for k, _ in rest], [b for _, b in rest])
            if done is None:
                return None
            read = dict(zip((k for k, _ in rest), done, strict=True))
        return [copied.get(key, read.get(key, False)) for key in keys]

    def _copy_from_host(self, keys: Sequence[bytes],
                        block_ids: Sequence[int]) -> dict[bytes, bool]:
        if self.host is None:
            return {}
        found = [(key, block, self.host.view(key)) for key, block in zip(keys, block_ids,
                                                                         strict=True)]
        found = [(key, block, view) for key, block, view in found if view is not None]
        if found:
            self._place([block for _, block, _ in found], [view for _, _, view in found])
        return {key: True for key, _, _ in found}

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
        self._from_host.pop(request_id, None)
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
