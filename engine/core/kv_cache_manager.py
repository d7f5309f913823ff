"""Per-request KV block bookkeeping on top of the BlockPool, for every KV cache group.

A request holds one block table per group (engine/core/kv_cache_groups.py), positional: entry
i holds tokens [i * block_size, (i + 1) * block_size). A sliding-window group gives back the
blocks its window has passed: their entries become the null block (`null_block_id`, the
zero block after the pool that the runner keeps), which no kernel reads.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from officellm.engine.core.block_pool import BlockPool, KVBlock, hash_block_tokens
from officellm.engine.core.image_ranges import block_image_hashes, hit_blocks_outside_images
from officellm.engine.core.kv_cache_groups import KVCacheGroups, first_needed_block
from officellm.engine.core.lower_tier import BlockSave, LowerTier
from officellm.engine.core.request import Request

# What a long-context request's salt ends with (Request.long_context).
LONG_CONTEXT_SALT = "\x00long-context"
# Blocks per group of a prefix-cache hit: in the pool, or the key of one the lower tier holds
# (start_load copies those in first); None where a sliding group needs no block.
GroupBlocks = tuple[list[KVBlock | bytes | None], ...]


def _cache_key(block_hash: bytes, group: int) -> bytes:
    """A group's own key for a block of tokens: the same tokens' KV differs per group."""
    return block_hash + struct.pack("<H", group)


@dataclass
class _Load:
    """A waiting request's prefix being copied in from the lower tier: the pool blocks set
    aside for the tier's blocks (uncached until they hold them), and the pool's own hits it
    holds meanwhile so nothing evicts them."""

    keys: list[bytes]
    blocks: list[KVBlock]
    held: list[KVBlock]
    num_tokens: int  # the prefix's tokens that come from the tier
    cache_salt: str | None
    discard: bool = False  # the salt was purged meanwhile: cache nothing it copied


class KVCacheManager:
    """Allocates the slots a request needs, finds its cached prefix, frees its blocks."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 evict_by_owner: bool = False, groups: KVCacheGroups | None = None,
                 lower_tier: LowerTier | None = None):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.groups = groups or KVCacheGroups.for_windows([None])
        self.windows = self.groups.windows
        # The runner's zero block after the pool: table entries behind a sliding window.
        self.null_block_id = num_blocks
        # With evict_by_owner, freed blocks are queued under their request's fairness key
        # (BlockPool).
        self.pool = BlockPool(num_blocks, enable_prefix_caching, evict_by_owner)
        # Per request, per group: its block table (None behind a sliding window).
        self.req_blocks: dict[str, list[list[KVBlock | None]]] = {}
        # Per request, per group: the first entry not yet given back (sliding groups).
        self._first_live: dict[str, list[int]] = {}
        # How many of a request's leading blocks were already offered to the prefix cache:
        # each full block is registered once, not re-examined every step.
        self._num_registered: dict[str, int] = {}
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        # Blocks in the block tables of each fairness key's requests, kept as they change so
        # the scheduling policy reads a key's holding in O(1) (a block two requests share
        # counts for each). Keys holding none are absent.
        self.blocks_by_key: dict[str, int] = {}
        # The tiers below the pool (engine/kv_offload/), if any: a prefix hit may come from
        # them, copied into pool blocks set aside while the request waits (start_load), and
        # every block the prefix cache registers is copied down to them after its step
        # (take_saves).
        self.lower_tier = lower_tier if enable_prefix_caching else None
        self._saves: list[BlockSave] = []
        self._loads: dict[str, _Load] = {}  # waiting requests whose prefix is copied in
        # Per request, the tokens of its prefix copied in from the tier, until admitted.
        self._loaded_tokens: dict[str, int] = {}
        # Prompt tokens admissions looked up, and found in the lower tier (vLLM's external
        # prefix cache counters); prefix_cache_hits counts the pool's hits alone.
        self.lower_tier_queries = 0
        self.lower_tier_hits = 0
        # What computing a prompt's tokens costs, in seconds, once measured (the scheduler's
        # prefill pacer): a prefix is read from the lower tier only where that is cheaper.
        self.prefill_seconds: Callable[[int], float | None] | None = None

    # -- hashing -------------------------------------------------------------------------
    def _update_block_hashes(self, request: Request) -> None:
        """Extend request.block_hashes over every full block of its known tokens."""
        bs = self.block_size
        hashes = request.block_hashes
        tokens = request.all_token_ids
        # KV computed in a model's long-context form never serves the short form, nor back.
        salt = request.cache_salt
        if request.long_context:
            salt = (salt or "") + LONG_CONTEXT_SALT
        while (len(hashes) + 1) * bs <= len(tokens):
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            images = (block_image_hashes(request.images, i * bs, (i + 1) * bs)
                      if request.images else ())
            hashes.append(hash_block_tokens(parent, tokens[i * bs : (i + 1) * bs], salt, images))

    # -- admission -----------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[GroupBlocks, int]:
        """The longest cached prefix of the request, as blocks per group and a token count.

        At least one token is always left to compute, since sampling needs its logits. A full
        group needs every block of the prefix; a sliding group only those its window still
        sees from the first token to compute, so the hit is the longest prefix every group
        can serve. Blocks only the lower tier holds come as their keys (start_load copies
        them in), and only where copying is expected to cost less than computing; none while
        the request's prefix is being copied in (is_loading).
        """
        empty: GroupBlocks = tuple([] for _ in self.windows)
        if not self.enable_prefix_caching:
            return empty, 0
        load = self._loads.get(request.request_id)
        if load is not None and not self._finish_load(request, load):
            return empty, 0
        self._update_block_hashes(request)
        use_tier = True
        while True:  # again without the tier when copying costs more
            found = self._find_blocks(request, use_tier)
            num = self._longest_common_hit(found)
            if not num:
                return empty, 0
            hit_tokens = num * self.block_size
            hits: list[list] = []
            for g, window in enumerate(self.windows):
                first = first_needed_block(window, hit_tokens, self.block_size)
                hits.append([None] * first + found[g][first:num])
            below = [b for blocks in hits for b in blocks if isinstance(b, bytes)]
            if below and not self._cheaper_to_read(below, hits):
                use_tier = False
                continue
            return tuple(hits), hit_tokens

    @staticmethod
    def needs_load(hits: GroupBlocks) -> bool:
        """Whether a hit has blocks only the lower tier holds (start_load first)."""
        return any(isinstance(b, bytes) for blocks in hits for b in blocks)

    def start_load(self, request: Request, hits: GroupBlocks) -> bool:
        """Set pool blocks aside for the hit's blocks in the lower tier and have the tier
        copy them in, holding the hit's pool blocks meanwhile; False (nothing taken) if the
        free blocks do not allow it. The request waits (is_loading) until the copies are
        done; get_computed_blocks then finds the whole prefix in the pool (a copy from RAM
        is done before this returns)."""
        assert self.lower_tier is not None
        keys = [b for blocks in hits for b in blocks if isinstance(b, bytes)]
        held = [b for blocks in hits for b in blocks if isinstance(b, KVBlock)]
        evictable = sum(1 for b in held if b.ref_count == 0)
        if len(keys) + evictable > self.pool.num_free_blocks:
            return False
        self.pool.touch(held)
        blocks = self.pool.allocate(len(keys), request.fairness_key, self.blocks_by_key)
        positions = {i for group in hits for i, b in enumerate(group) if isinstance(b, bytes)}
        load = _Load(keys, blocks, held, self.block_size * len(positions), request.cache_salt)
        self._loads[request.request_id] = load
        self._finish_load(request, load)
        return True

    def _finish_load(self, request: Request, load: _Load) -> bool:
        """Whether the request's copies are done; once they are, its blocks join the prefix
        cache (those copied whole) and go back to the free queue with the hits it held, to
        be taken as hits by its admission."""
        assert self.lower_tier is not None
        rid = request.request_id
        copied = self.lower_tier.fetch(rid, load.keys, [b.block_id for b in load.blocks])
        if copied is None:
            return False
        del self._loads[rid]
        self.lower_tier.release(rid)
        if not load.discard:
            for key, block, ok in zip(load.keys, load.blocks, copied, strict=True):
                if ok:
                    self.pool.cache_block(block, key, load.cache_salt)
        # Last-first, as a request's blocks are freed: the prefix is evicted last.
        self.pool.free(list(reversed(load.blocks)) + load.held, owner=request.fairness_key)
        self._loaded_tokens[rid] = 0 if load.discard or not all(copied) else load.num_tokens
        return True

    def _cancel_load(self, request: Request) -> None:
        """Give back a gone request's blocks set aside for copies (once nothing writes them)."""
        load = self._loads.pop(request.request_id, None)
        if load is None:
            return
        assert self.lower_tier is not None
        self.lower_tier.release(request.request_id)
        self.pool.free(list(reversed(load.blocks)) + load.held, owner=request.fairness_key)

    @property
    def num_loading(self) -> int:
        """Waiting requests whose prefix is being copied in."""
        return len(self._loads)

    def cached_prefix_tokens(self, request: Request) -> int:
        """The tokens get_computed_blocks would find cached (in the pool or the lower tier),
        without reading anything: how much of a waiting prompt is work left."""
        if not self.enable_prefix_caching:
            return 0
        self._update_block_hashes(request)
        return self._longest_common_hit(self._find_blocks(request)) * self.block_size

    def _cheaper_to_read(self, below: list[bytes], hits: list[list]) -> bool:
        """Whether reading these blocks from the lower tier is expected to take less than
        computing their tokens (true until both are measured: a CPU computes a prompt at
        hundreds of tokens a second and reads its KV at hundreds of MB)."""
        assert self.lower_tier is not None
        read = self.lower_tier.read_seconds(below)
        tokens = self.block_size * len({i for blocks in hits for i, b in enumerate(blocks)
                                        if isinstance(b, bytes)})
        compute = self.prefill_seconds(tokens) if self.prefill_seconds is not None else None
        return read is None or compute is None or read <= compute

    def _find_blocks(self, request: Request,
                     use_tier: bool = True) -> list[list[KVBlock | bytes | None]]:
        """Per group, each leading full block of the prompt (one token always left to
        compute): the pool's block, the key of one the lower tier holds (`use_tier`), or
        None."""
        num = (request.num_tokens - 1) // self.block_size
        if request.images:  # a hit never ends inside an image: back off to its start
            num = hit_blocks_outside_images(request.images, num, self.block_size)
        found: list[list[KVBlock | bytes | None]] = []
        for g in range(len(self.windows)):
            keys = [_cache_key(h, g) for h in request.block_hashes[:num]]
            blocks: list[KVBlock | bytes | None] = [self.pool.lookup(k) for k in keys]
            if self.lower_tier is not None and use_tier:
                for i, key in enumerate(keys):
                    if blocks[i] is None and self.lower_tier.holds(key):
                        blocks[i] = key
            found.append(blocks)
        return found

    def _longest_common_hit(self, found: list[list[KVBlock | bytes | None]]) -> int:
        """The most leading blocks every group can serve a hit of."""
        num = len(found[0]) if found else 0
        changed = True
        while changed and num:  # each pass can only shorten the hit
            changed = False
            for g, window in enumerate(self.windows):
                fit = self._longest_hit(found[g], num, window)
                if fit < num:
                    num, changed = fit, True
        return num

    def is_loading(self, request: Request) -> bool:
        """Whether the request's prefix is being copied in from the lower tier: it waits
        for it, and admission goes on past it."""
        return request.request_id in self._loads

    def take_saves(self) -> tuple[BlockSave, ...]:
        """The blocks the allocations since the last call fill, to be copied down to the
        lower tier after the step that fills them."""
        saves = tuple(self._saves)
        self._saves.clear()
        return saves

    def _longest_hit(self, found: list[KVBlock | bytes | None], num: int,
                     window: int | None) -> int:
        """The most leading blocks (<= num) this group can serve a hit of."""
        if window is None:
            for i in range(num):
                if found[i] is None:
                    return i
            return num
        # A hit of n blocks needs blocks [first_needed(n * bs), n): scan down from num.
        missing_before = [0] * (num + 1)  # missing_before[i]: misses among found[:i]
        for i in range(num):
            missing_before[i + 1] = missing_before[i] + (found[i] is None)
        for n in range(num, 0, -1):
            first = first_needed_block(window, n * self.block_size, self.block_size)
            if missing_before[n] == missing_before[first]:
                return n
        return 0

    def record_prefix_lookup(self, request: Request, num_hit_tokens: int) -> None:
        """Count one admission's lookup (called only when the request is admitted): its
        hit, the part copied in from the lower tier apart."""
        num_queried_tokens = request.num_tokens
        from_tier = min(self._loaded_tokens.pop(request.request_id, 0), num_hit_tokens)
        self.prefix_cache_queries += num_queried_tokens
        self.prefix_cache_hits += num_hit_tokens - from_tier
        if self.lower_tier is not None:
            self.lower_tier_queries += num_queried_tokens
            self.lower_tier_hits += from_tier

    def num_blocks_after(self, request: Request, num_new_tokens: int,
                         num_computed_tokens: int | None = None) -> int:
        """Blocks the request holds, all groups together, once `num_new_tokens` more are
        allocated (from num_computed_tokens, default the request's)."""
        start = request.num_computed_tokens if num_computed_tokens is None else num_computed_tokens
        return self.groups.blocks_held(start + num_new_tokens, self.block_size, num_new_tokens)

    def allocate_slots(
        self, request: Request, num_new_tokens: int,
        new_computed_blocks: GroupBlocks | None = None,
    ) -> bool:
        """Make room for `num_new_tokens` more tokens of `request`; False if blocks ran out.

        `new_computed_blocks` are prefix-cache hits taken at admission (per group): they are
        referenced here (and count as computed) only if the allocation as a whole succeeds.
        A sliding group first gives back the blocks behind the window of the first new token.
        """
        bs = self.block_size
        rid = request.request_id
        tables = self.req_blocks.get(rid)
        hit = new_computed_blocks is not None and any(new_computed_blocks)
        if not hit and tables is not None:
            # The common case, a decode inside its last block: nothing to take from the pool.
            total_tokens = request.num_computed_tokens + num_new_tokens
            if total_tokens <= len(tables[0]) * bs:
                self._slide(request, tables, request.num_computed_tokens)
                if self.enable_prefix_caching and \
                        total_tokens // bs > self._num_registered.get(rid, 0):
                    self._register_full_blocks(request, tables, total_tokens)
                return True
        computed = new_computed_blocks if hit else None
        num_hit = len(computed[0]) * bs if computed is not None else 0
        start = request.num_computed_tokens + num_hit
        total_tokens = start + num_new_tokens
        total_blocks = -(-total_tokens // bs)
        held = len(tables[0]) if tables is not None else 0
        needed = []  # new blocks per group
        for g, window in enumerate(self.windows):
            first = first_needed_block(window, start, bs)
            # Entries below `first` (if any are new) are the null block.
            base = max(held, len(computed[g]) if computed is not None else 0, first)
            needed.append(max(0, total_blocks - base))
        if sum(needed) or computed is not None:
            # Hit blocks that nobody holds sit in the free queue: taking them uses free
            # capacity. Blocks this request gives back first (behind a window) add to it.
            evictable_hits = sum(1 for blocks in (computed or ()) for b in blocks
                                 if b is not None and b.ref_count == 0)
            released = self._releasable(request, tables, start)
            if sum(needed) + evictable_hits > self.pool.num_free_blocks + released:
                return False
        if tables is None:
            tables = self.req_blocks[rid] = [[] for _ in self.windows]
            self._first_live[rid] = [0] * len(self.windows)
            request.block_ids = [[] for _ in self.windows]
        self._slide(request, tables, start)
        gained = 0
        key = request.fairness_key
        if computed is not None:
            # Every group's pool hits are taken before any block is allocated, so that no
            # allocation evicts a hit of a later group.
            self.pool.touch([b for blocks in computed for b in blocks if b is not None])
        for g, window in enumerate(self.windows):
            table, ids = tables[g], request.block_ids[g]
            if computed is not None and computed[g]:
                gained += sum(1 for b in computed[g] if b is not None)
                table.extend(computed[g])
                ids.extend(self.null_block_id if b is None else b.block_id for b in computed[g])
                self._first_live[rid][g] = first_needed_block(window, start, bs)
            first = first_needed_block(window, start, bs)
            if len(table) < first:  # new entries already behind the window
                gap = first - len(table)
                table.extend([None] * gap)
                ids.extend([self.null_block_id] * gap)
                self._first_live[rid][g] = max(self._first_live[rid][g], first)
            if needed[g]:
                new = self.pool.allocate(needed[g], key, self.blocks_by_key)
                table.extend(new)
                ids.extend(b.block_id for b in new)
                gained += len(new)
        if gained:
            self.blocks_by_key[key] = self.blocks_by_key.get(key, 0) + gained
        if self.enable_prefix_caching:
            self._register_full_blocks(request, tables, total_tokens)
        return True

    def uncache_salt(self, cache_salt: str | None) -> int:
        """Forget the pool's cached blocks computed under this salt (a person's cache
        purged), and what is being copied in for it; the blocks forgotten."""
        for load in self._loads.values():
            if load.cache_salt == cache_salt:
                load.discard = True
        return self.pool.uncache_salt(cache_salt)

    def _releasable(self, request: Request, tables: list[list[KVBlock | None]] | None,
                    start: int) -> int:
        """Blocks `_slide(request, tables, start)` would put back in the free queue."""
        if tables is None:
            return 0
        first_live = self._first_live[request.request_id]
        count = 0
        for g, window in enumerate(self.windows):
            if window is None:
                continue
            first = min(first_needed_block(window, start, self.block_size), len(tables[g]))
            count += sum(1 for b in tables[g][first_live[g]:first]
                         if b is not None and b.ref_count == 1)
        return count

    def _slide(self, request: Request, tables: list[list[KVBlock | None]], start: int) -> None:
        """Give back each sliding group's blocks behind the window of token `start` (the
        first the next step computes: no later query reads further back)."""
        rid = request.request_id
        first_live = self._first_live[rid]
        freed = 0
        for g, window in enumerate(self.windows):
            if window is None:
                continue
            first = min(first_needed_block(window, start, self.block_size), len(tables[g]))
            if first <= first_live[g]:
                continue
            table, ids = tables[g], request.block_ids[g]
            behind = [b for b in table[first_live[g]:first] if b is not None]
            self.pool.free(behind, owner=request.fairness_key)
            freed += len(behind)
            for i in range(first_live[g], first):
                table[i] = None
                ids[i] = self.null_block_id
            first_live[g] = first
        if freed:
            self._drop_held(request.fairness_key, freed)

    def _register_full_blocks(self, request: Request, tables: list[list[KVBlock | None]],
                              num_tokens: int) -> None:
        """Offer the blocks this step fills completely to the prefix cache (their KV is
        written in this step); hit blocks are cached already."""
        rid = request.request_id
        done = self._num_registered.get(rid, 0)
        num_full = num_tokens // self.block_size
        if num_full <= done:
            return
        self._update_block_hashes(request)
        num_full = min(num_full, len(request.block_hashes))
        tier = self.lower_tier
        for g, table in enumerate(tables):
            for i in range(done, num_full):
                block = table[i]
                if block is not None and block.block_hash is None:
                    key = _cache_key(request.block_hashes[i], g)
                    self.pool.cache_block(block, key, request.cache_salt)
                    if tier is not None and block.block_hash == key and not tier.holds(key):
                        self._saves.append(BlockSave(block.block_id, key, request.cache_salt))
        self._num_registered[rid] = num_full

    # -- release -------------------------------------------------------------------------
    def free(self, request: Request, discard: bool = False) -> list[int]:
        """Release every block of the request; cached ones stay reusable until evicted.

        With discard (a request whose computation went bad), blocks nobody else holds lose
        their hash so they are never hit again; their ids are returned for scrubbing.
        """
        tables = self.req_blocks.pop(request.request_id, [])
        self._cancel_load(request)
        self._loaded_tokens.pop(request.request_id, None)
        self._first_live.pop(request.request_id, None)
        self._num_registered.pop(request.request_id, None)
        blocks = [b for table in tables for b in reversed(table) if b is not None]
        # Last-first, so the tail is evicted before the prefix.
        self.pool.free(blocks, owner=request.fairness_key)
        request.block_ids = []
        if blocks:
            self._drop_held(request.fairness_key, len(blocks))
        if not discard:
            return []
        orphans = [b for b in blocks if b.ref_count == 0]
        for block in orphans:
            self.pool.uncache(block)
        return [b.block_id for b in orphans]

    def _drop_held(self, key: str, count: int) -> None:
        left = self.blocks_by_key[key] - count
        if left:
            self.blocks_by_key[key] = left
        else:
            del self.blocks_by_key[key]

    def num_blocks_held(self, request_id: str) -> int:
        return sum(1 for table in self.req_blocks.get(request_id, ()) for b in table
                   if b is not None)
