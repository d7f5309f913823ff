"""Per-request KV block bookkeeping on top of the BlockPool."""

from __future__ import annotations

from officellm.engine.core.block_pool import BlockPool, KVBlock, hash_block_tokens
from officellm.engine.core.request import Request


class KVCacheManager:
    """Allocates the slots a request needs, finds its cached prefix, frees its blocks."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 evict_by_owner: bool = False):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # With evict_by_owner, freed blocks are queued under their request's fairness key
        # (BlockPool).
        self.pool = BlockPool(num_blocks, enable_prefix_caching, evict_by_owner)
        self.req_blocks: dict[str, list[KVBlock]] = {}
        # How many of a request's leading blocks were already offered to the prefix cache:
        # each full block is registered once, not re-examined every step.
        self._num_registered: dict[str, int] = {}
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        # Blocks in the block tables of each fairness key's requests, kept as they change so
        # the scheduling policy reads a key's holding in O(1) (a block two requests share
        # counts for each). Keys holding none are absent.
        self.blocks_by_key: dict[str, int] = {}

    # -- hashing -------------------------------------------------------------------------
    def _update_block_hashes(self, request: Request) -> None:
        """Extend request.block_hashes over every full block of its known tokens."""
        bs = self.block_size
        hashes = request.block_hashes
        tokens = request.all_token_ids
        while (len(hashes) + 1) * bs <= len(tokens):
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block_tokens(parent, tokens[i * bs : (i + 1) * bs], request.cache_salt))

    # -- admission -----------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The longest cached prefix of the request, as blocks and a token count.

        At least one token is always left to compute, since sampling needs its logits.
        """
        if not self.enable_prefix_caching:
            return [], 0
        self._update_block_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_prefix_lookup(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        """Count one admission's lookup (called only when the request is admitted)."""
        self.prefix_cache_queries += num_queried_tokens
        self.prefix_cache_hits += num_hit_tokens

    def allocate_slots(
        self, request: Request, num_new_tokens: int, new_computed_blocks: list[KVBlock] | None = None
    ) -> bool:
        """Make room for `num_new_tokens` more tokens of `request`; False if blocks ran out.

        `new_computed_blocks` are prefix-cache hits taken at admission: they are referenced
        here (and count as computed) only if the allocation as a whole succeeds.
        """
        bs = self.block_size
        if not new_computed_blocks:
            # The common case, a decode inside its last block: nothing to take from the pool.
            total_tokens = request.num_computed_tokens + num_new_tokens
            if total_tokens <= len(request.block_ids) * bs:
                if self.enable_prefix_caching and \
                        total_tokens // bs > self._num_registered.get(request.request_id, 0):
                    self._register_full_blocks(request, self.req_blocks[request.request_id],
                                               total_tokens)
                return True
        computed = new_computed_blocks or ()
        blocks = self.req_blocks.get(request.request_id)
        num_held = len(blocks) if blocks is not None else 0
        total_tokens = request.num_computed_tokens + len(computed) * bs + num_new_tokens
        needed = -(-total_tokens // bs) - num_held - len(computed)
        if needed > 0 or computed:
            # Hit blocks that nobody holds sit in the free queue: taking them uses free capacity.
            evictable_hits = sum(1 for b in computed if b.ref_count == 0)
            if needed + evictable_hits > self.pool.num_free_blocks:
                return False
            if blocks is None:
                blocks = self.req_blocks[request.request_id] = []
            if computed:
                self.pool.touch(computed)
                blocks.extend(computed)
                request.block_ids.extend(b.block_id for b in computed)
            if needed > 0:
                new = self.pool.allocate(needed, request.fairness_key, self.blocks_by_key)
                blocks.extend(new)
                request.block_ids.extend(b.block_id for b in new)
            gained = len(computed) + max(needed, 0)
            if gained:
                key = request.fairness_key
                self.blocks_by_key[key] = self.blocks_by_key.get(key, 0) + gained
        if self.enable_prefix_caching and blocks:
            self._register_full_blocks(request, blocks, total_tokens)
        return True

    def _register_full_blocks(self, request: Request, blocks: list[KVBlock], num_tokens: int) -> None:
        """Offer the blocks this step fills completely to the prefix cache (their KV is
        written in this step); hit blocks are cached already."""
        done = self._num_registered.get(request.request_id, 0)
        num_full = num_tokens // self.block_size
        if num_full <= done:
            return
        self._update_block_hashes(request)
        num_full = min(num_full, len(request.block_hashes))
        for i in range(done, num_full):
            if blocks[i].block_hash is None:
                self.pool.cache_block(blocks[i], request.block_hashes[i])
        self._num_registered[request.request_id] = num_full

    # -- release -------------------------------------------------------------------------
    def free(self, request: Request, discard: bool = False) -> list[int]:
        """Release every block of the request; cached ones stay reusable until evicted.

        With discard (a request whose computation went bad), blocks nobody else holds lose
        their hash so they are never hit again; their ids are returned for scrubbing.
        """
        blocks = self.req_blocks.pop(request.request_id, [])
        self._num_registered.pop(request.request_id, None)
        self.pool.free(list(reversed(blocks)), owner=request.fairness_key)
        request.block_ids = []
        if blocks:
            key = request.fairness_key
            left = self.blocks_by_key[key] - len(blocks)
            if left:
                self.blocks_by_key[key] = left
            else:
                del self.blocks_by_key[key]
        if not discard:
            return []
        orphans = [b for b in blocks if b.ref_count == 0]
        for block in orphans:
            self.pool.uncache(block)
        return [b.block_id for b in orphans]

    def num_blocks_held(self, request_id: str) -> int:
        return len(self.req_blocks.get(request_id, []))
