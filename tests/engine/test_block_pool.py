"""BlockPool and KVCacheManager: LRU free queue, reference counts, chained hashes."""

from __future__ import annotations

from officellm.engine.core.block_pool import BlockPool, hash_block_tokens
from officellm.engine.core.kv_cache_manager import KVCacheManager
from officellm.engine.core.request import Request
from officellm.engine.frontend.sampling_params import SamplingParams


def _req(rid: str, tokens: list[int], salt: str | None = None) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4), cache_salt=salt)


def test_equal_prefixes_hash_equal_and_chain_through_parents():
    a = hash_block_tokens(None, [1, 2, 3], None)
    assert a == hash_block_tokens(None, [1, 2, 3], None)
    assert hash_block_tokens(a, [4, 5, 6], None) != hash_block_tokens(None, [4, 5, 6], None)


def test_the_salt_enters_the_first_blocks_hash():
    assert hash_block_tokens(None, [1, 2], "alice") != hash_block_tokens(None, [1, 2], "bob")
    assert hash_block_tokens(None, [1, 2], "alice") != hash_block_tokens(None, [1, 2], None)


def test_a_later_blocks_hash_depends_on_the_salt_only_through_its_parent():
    parent = hash_block_tokens(None, [1, 2], "alice")
    later = {hash_block_tokens(parent, [3, 4], salt) for salt in ("alice", "bob", None)}
    assert len(later) == 1  # same parent + same tokens: same hash, whatever the salt


def test_salted_requests_chain_their_block_hashes_from_a_salted_first_block():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    tokens = list(range(12))
    hashes = {}
    for salt in ("alice", "bob"):
        req = _req(salt, tokens, salt=salt)
        kv.get_computed_blocks(req)  # fills req.block_hashes over its full blocks
        hashes[salt] = req.block_hashes
    assert len(hashes["alice"]) == len(hashes["bob"]) == 3
    assert not set(hashes["alice"]) & set(hashes["bob"])  # the first differs, so all do
    for salt, h in hashes.items():
        assert h[0] == hash_block_tokens(None, tokens[:4], salt)
        assert h[1] == hash_block_tokens(h[0], tokens[4:8], None)
        assert h[2] == hash_block_tokens(h[1], tokens[8:12], None)


def test_allocate_takes_least_recently_freed_first():
    pool = BlockPool(4)
    first = pool.allocate(2)
    pool.free(first)
    # Blocks 2 and 3 were never used, so they are older in the free queue than 0 and 1.
    assert [b.block_id for b in pool.allocate(2)] == [2, 3]
    assert [b.block_id for b in pool.allocate(2)] == [0, 1]


def test_touching_a_cached_free_block_removes_it_from_the_free_queue():
    pool = BlockPool(3)
    (block,) = pool.allocate(1)
    pool.cache_block(block, b"h")
    pool.free([block])
    assert pool.num_free_blocks == 3 and pool.lookup(b"h") is block
    pool.touch([block])
    assert pool.num_free_blocks == 2 and block.ref_count == 1
    pool.touch([block])
    pool.free([block])
    assert pool.num_free_blocks == 2  # still held once
    pool.free([block])
    assert pool.num_free_blocks == 3


def test_reallocating_a_cached_block_evicts_its_hash():
    pool = BlockPool(1)
    (block,) = pool.allocate(1)
    pool.cache_block(block, b"h")
    pool.free([block])
    pool.allocate(1)
    assert pool.lookup(b"h") is None


def test_manager_finds_the_cached_prefix_but_always_leaves_one_token():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    a = _req("a", list(range(12)))
    assert kv.allocate_slots(a, 12)
    kv.free(a)
    b = _req("b", list(range(12)))
    hits, n = kv.get_computed_blocks(b)
    assert n == 8 and len(hits[0]) == 2  # the third block would leave nothing to compute
    c = _req("c", list(range(13)))
    assert kv.get_computed_blocks(c)[1] == 12


def test_different_salts_never_share_blocks():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    a = _req("a", list(range(12)), salt="alice")
    kv.allocate_slots(a, 12)
    kv.free(a)
    assert kv.get_computed_blocks(_req("b", list(range(12)), salt="bob"))[1] == 0
    assert kv.get_computed_blocks(_req("c", list(range(12)), salt="alice"))[1] == 8


def test_allocation_fails_cleanly_when_blocks_run_out():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    a = _req("a", list(range(12)))
    assert not kv.allocate_slots(a, 12)
    assert kv.pool.num_free_blocks == 2 and kv.num_blocks_held("a") == 0


def test_free_releases_the_tail_before_the_prefix():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    a = _req("a", list(range(12)))
    kv.allocate_slots(a, 12)
    ids = list(a.block_ids[0])
    kv.free(a)
    # The last block of the request is evicted first, the shared prefix last.
    assert [b.block_id for b in kv.pool.allocate(3)] == list(reversed(ids))


# -- eviction by owner (the fair policy's) ------------------------------------------------

def _freed_by(pool: BlockPool, owner: str, count: int) -> list[int]:
    blocks = pool.allocate(count)
    pool.free(blocks, owner=owner)
    return [b.block_id for b in blocks]


def test_by_owner_the_key_with_the_most_free_blocks_is_evicted_first():
    pool = BlockPool(6, evict_by_owner=True)
    light = _freed_by(pool, "light", 2)  # freed first: plain LRU would evict these first
    heavy = _freed_by(pool, "heavy", 4)
    assert [b.block_id for b in pool.allocate(2)] == heavy[:2]
    # Now both keys have two free blocks: on a tie the allocating key's own go first.
    assert [b.block_id for b in pool.allocate(1, owner="heavy")] == heavy[2:3]
    assert [b.block_id for b in pool.allocate(1, owner="light")] == light[:1]


def test_by_owner_blocks_a_key_holds_count_toward_its_footprint():
    pool = BlockPool(6, evict_by_owner=True)
    light = _freed_by(pool, "light", 3)
    heavy = _freed_by(pool, "heavy", 1)
    pool.allocate(2)  # the never-used ones
    # The heavy key holds 5 more blocks in running requests: its one free block goes first.
    assert [b.block_id for b in pool.allocate(2, "light", {"heavy": 5})] == heavy + light[:1]


def test_by_owner_never_used_blocks_go_before_any_freed_block():
    pool = BlockPool(4, evict_by_owner=True)
    freed = _freed_by(pool, "heavy", 2)
    assert [b.block_id for b in pool.allocate(2)] == [2, 3]
    assert [b.block_id for b in pool.allocate(2)] == freed


def test_by_owner_a_lone_key_evicts_in_the_plain_order():
    plain, owned = BlockPool(5), BlockPool(5, evict_by_owner=True)
    order = []
    for pool in (plain, owned):
        first = pool.allocate(2)
        second = pool.allocate(2)
        pool.free(second, owner="alice")
        pool.free(first, owner="alice")
        order.append([b.block_id for b in pool.allocate(5)])
    assert order[0] == order[1]


def test_by_owner_a_hit_block_leaves_its_owners_queue():
    pool = BlockPool(3, evict_by_owner=True)
    (block,) = pool.allocate(1)
    pool.cache_block(block, b"h")
    pool.free([block], owner="alice")
    pool.touch([block])
    assert pool.num_free_blocks == 2 and block not in pool.allocate(2)


def test_fair_eviction_keeps_a_light_users_prefix_while_a_heavy_user_churns():
    kept = {}
    for by_owner in (False, True):
        kv = KVCacheManager(num_blocks=12, block_size=4, evict_by_owner=by_owner)
        chat = Request("chat", list(range(16)), SamplingParams(max_tokens=4),
                       fairness_key="light")
        assert kv.allocate_slots(chat, 16)
        kv.free(chat)  # the light user reads the answer; its 4 blocks stay cached
        for i in range(3):  # the heavy user's documents, one after another
            doc = Request(f"doc{i}", [1000 * (i + 1) + t for t in range(24)],
                          SamplingParams(max_tokens=4), fairness_key="heavy")
            assert kv.allocate_slots(doc, 24)
            kv.free(doc)
        kept[by_owner] = kv.get_computed_blocks(_req("next", list(range(20))))[1]
    assert kept == {False: 0, True: 16}
