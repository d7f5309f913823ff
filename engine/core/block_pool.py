"""Fixed-size KV blocks: free queue in LRU order, reference counts, prefix-cache hash map."""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


def hash_block_tokens(parent_hash: bytes | None, token_ids: Sequence[int], salt: str | None) -> bytes:
    """Chain a block's hash to its parent's, so equal prefixes map to equal blocks.

    The salt enters only the first block (parent None): requests with different salts never
    share blocks. blake2b keeps collisions, and so wrong KV reuse, out of reach.
    """
    h = hashlib.blake2b(digest_size=16)
    if parent_hash is None:
        h.update(b"salt:" + (salt or "").encode())
    else:
        h.update(parent_hash)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.digest()


@dataclass(eq=False)
class KVBlock:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None


class BlockPool:
    """Owns every KV block.

    A block with ref_count 0 sits in the free queue (an OrderedDict: O(1) removal from the
    middle when a cached block is hit, O(1) pop of the least recently freed). Freed blocks
    keep their hash until they are handed out again, so a later request can reuse them.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[bytes, KVBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0

    def lookup(self, block_hash: bytes) -> KVBlock | None:
        return self._cached.get(block_hash) if self.enable_caching else None

    def allocate(self, count: int) -> list[KVBlock]:
        """Take `count` blocks from the head of the free queue, evicting their cached content."""
        if count > len(self._free):
            raise RuntimeError(f"asked for {count} blocks, {len(self._free)} free")
        out = []
        for _ in range(count):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            self._evict(block)
            block.ref_count = 1
            out.append(block)
        return out

    def touch(self, blocks: Sequence[KVBlock]) -> None:
        """Take a reference on cached blocks hit by a new request."""
        for block in blocks:
            if block.ref_count == 0:
                del self._free[block.block_id]
            block.ref_count += 1

    def free(self, blocks: Sequence[KVBlock]) -> None:
        """Drop a reference; blocks nobody holds go to the tail of the free queue.

        Callers pass a request's blocks last-first, so its tail is evicted before its prefix.
        """
        for block in blocks:
            block.ref_count -= 1
            if block.ref_count < 0:
                raise RuntimeError(f"block {block.block_id} freed twice")
            if block.ref_count == 0:
                self._free[block.block_id] = None

    def cache_block(self, block: KVBlock, block_hash: bytes) -> None:
        """Register a full block's hash; the first block to hold some content stays the one hit."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self._cached:
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block

    def uncache(self, block: KVBlock) -> None:
        """Forget a block's content (it stays where it is in the free queue)."""
        self._evict(block)

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            if self._cached.get(block.block_hash) is block:
                del self._cached[block.block_hash]
            block.block_hash = None
