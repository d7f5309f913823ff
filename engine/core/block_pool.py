"""Fixed-size KV blocks: free queue in LRU order, reference counts, prefix-cache hash map."""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def hash_block_tokens(parent_hash: bytes | None, token_ids: Sequence[int], salt: str | None,
                      image_hashes: Sequence[str] = ()) -> bytes:
    """Chain a block's hash to its parent's, so equal prefixes map to equal blocks.

    The salt enters only the first block (parent None): requests with different salts never
    share blocks. `image_hashes`: the content hashes of the images the block's tokens hold
    placeholders of (vLLM's extra keys): their ids are the same for every image, their KV
    is not. blake2b keeps collisions, and so wrong KV reuse, out of reach.
    """
    h = hashlib.blake2b(digest_size=16)
    if parent_hash is None:
        h.update(b"salt:" + (salt or "").encode())
    else:
        h.update(parent_hash)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    for image_hash in image_hashes:
        h.update(b"image:" + image_hash.encode())
    return h.digest()


@dataclass(eq=False)
class KVBlock:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None
    cache_salt: str | None = None  # whose prefix cache the hash is in (with block_hash)


class BlockPool:
    """Owns every KV block.

    A block with ref_count 0 sits in a free queue (an OrderedDict: O(1) removal from the
    middle when a cached block is hit, O(1) pop of the least recently freed). Freed blocks
    keep their hash until they are handed out again, so a later request can reuse them.

    Eviction is least recently freed first, never-used blocks before all. With
    `evict_by_owner` (the fair scheduling policy's), a freed block is queued under the
    fairness key that freed it, and after the never-used blocks comes the least recently
    freed block of the key with the largest footprint in the pool (blocks held and free):
    one user's stream of documents evicts its own stale documents before a colleague's
    conversation, whose cached prefix saves a whole prefill of the next turn. With one key
    the order is the same as without.
    """

    # The queue of the never-used blocks (and of every freed block, without evict_by_owner).
    EMPTY = None

    def __init__(self, num_blocks: int, enable_caching: bool = True,
                 evict_by_owner: bool = False) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.evict_by_owner = evict_by_owner
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: dict[str | None, OrderedDict[int, None]] = {
            self.EMPTY: OrderedDict((i, None) for i in range(num_blocks))}
        self._queue_of: dict[int, str | None] = dict.fromkeys(range(num_blocks), self.EMPTY)
        self._cached: dict[bytes, KVBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._queue_of)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._queue_of)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0

    def lookup(self, block_hash: bytes) -> KVBlock | None:
        return self._cached.get(block_hash) if self.enable_caching else None

    def allocate(self, count: int, owner: str = "",
                 held: Mapping[str, int] | None = None) -> list[KVBlock]:
        """Take `count` free blocks in eviction order, evicting their cached content.

        With evict_by_owner the blocks come from the key with the largest footprint: its
        free blocks plus the blocks `held` says it holds, plus, for `owner` (the key this
        allocation is for), those taken so far; on a tie the owner's own go first.
        """
        if count > len(self._queue_of):
            raise RuntimeError(f"asked for {count} blocks, {len(self._queue_of)} free")
        held = held or {}
        out = []
        for _ in range(count):
            queue = self.EMPTY
            if not self._free[self.EMPTY]:
                def footprint(k: str) -> tuple[int, bool]:
                    mine = k == owner
                    return len(self._free[k]) + held.get(k, 0) + (len(out) if mine else 0), mine
                queue = max((k for k in self._free if k is not self.EMPTY), key=footprint)
            block_id, _ = self._free[queue].popitem(last=False)
            del self._queue_of[block_id]
            if not self._free[queue] and queue is not self.EMPTY:
                del self._free[queue]
            block = self.blocks[block_id]
            self._evict(block)
            block.ref_count = 1
            out.append(block)
        return out

    def touch(self, blocks: Sequence[KVBlock]) -> None:
        """Take a reference on cached blocks hit by a new request."""
        for block in blocks:
            if block.ref_count == 0:
                self._dequeue(block.block_id)
            block.ref_count += 1

    def free(self, blocks: Sequence[KVBlock], owner: str = "") -> None:
        """Drop a reference; blocks nobody holds go to the tail of a free queue (`owner`'s,
        with evict_by_owner).

        Callers pass a request's blocks last-first, so its tail is evicted before its prefix.
        """
        for block in blocks:
            block.ref_count -= 1
            if block.ref_count < 0:
                raise RuntimeError(f"block {block.block_id} freed twice")
            if block.ref_count == 0:
                queue = owner if self.evict_by_owner else self.EMPTY
                self._free.setdefault(queue, OrderedDict())[block.block_id] = None
                self._queue_of[block.block_id] = queue

    def _dequeue(self, block_id: int) -> None:
        queue = self._queue_of.pop(block_id)
        del self._free[queue][block_id]
        if not self._free[queue] and queue is not self.EMPTY:
            del self._free[queue]

    def cache_block(self, block: KVBlock, block_hash: bytes, cache_salt: str | None = None) -> None:
        """Register a full block's hash (computed under `cache_salt`); the first block to
        hold some content stays the one hit."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self._cached:
            return
        block.block_hash = block_hash
        block.cache_salt = cache_salt
        self._cached[block_hash] = block

    def uncache_salt(self, cache_salt: str | None) -> int:
        """Forget every cached block computed under `cache_salt`; how many."""
        blocks = [b for b in self._cached.values() if b.cache_salt == cache_salt]
        for block in blocks:
            self._evict(block)
        return len(blocks)

    def uncache(self, block: KVBlock) -> None:
        """Forget a block's content (a free one stays where it is in the eviction order)."""
        self._evict(block)

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            if self._cached.get(block.block_hash) is block:
                del self._cached[block.block_hash]
            block.block_hash = None
            block.cache_salt = None
