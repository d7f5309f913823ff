"""Sliding-window layers in the paged KV cache: layers grouped by attention type, a sliding
group giving back the blocks its window has passed while the global layers keep theirs, the
prefix cache serving a hit only where every group still has what it needs, nothing leaked,
and the planner counting what the pool really holds."""

from __future__ import annotations

import pytest

from officellm.engine import SamplingParams
from officellm.engine.core.kv_cache_groups import KVCacheGroups, first_needed_block
from officellm.engine.core.kv_cache_manager import KVCacheManager
from officellm.engine.core.request import Request
from officellm.engine.kv_plan import make_plan
from officellm.engine.loading.model_spec import ModelSpec
from tests.engine.conftest import make_llm
from tests.support.tiny_models import TINY_WINDOW, shared_tiny_model

BS = 4
WINDOW = 8
NULL = 64  # the manager's null block id: the pool has 64 blocks


def _req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=64))


def _manager(num_blocks: int = 64, caching: bool = True) -> KVCacheManager:
    """One global and one sliding layer: two groups of one layer each."""
    return KVCacheManager(num_blocks, BS, caching,
                          groups=KVCacheGroups.for_windows([None, WINDOW]))


def _run(kv: KVCacheManager, req: Request, num_new: int) -> None:
    """Allocate a step of `num_new` tokens and mark them computed, as a step would."""
    assert kv.allocate_slots(req, num_new)
    req.num_computed_tokens += num_new


def test_layers_are_grouped_by_window_into_equal_sized_groups():
    # Gemma 3 27B: five sliding layers for every global one, 62 layers.
    windows = [None if (i + 1) % 6 == 0 else 1024 for i in range(62)]
    groups = KVCacheGroups.for_windows(windows)
    assert groups.layers_per_block == 10  # its 10 global layers
    assert [g.window for g in groups.groups] == [None] + [1024] * 6
    assert sorted(i for g in groups.groups for i in g.layers) == list(range(62))
    assert all(len(g.layers) <= 10 for g in groups.groups)
    # gpt-oss: as many sliding as global layers, two groups.
    assert KVCacheGroups.for_windows([128, None] * 12).layers_per_block == 12


def test_a_model_of_one_attention_type_is_one_group_of_every_layer():
    groups = KVCacheGroups.for_windows([None] * 30)
    assert groups.uniform and groups.layers_per_block == 30
    assert groups.blocks_held(100, 16) == 7


def test_the_sliding_group_gives_back_blocks_its_window_has_passed():
    kv = _manager()
    req = _req("a", list(range(40)))
    _run(kv, req, 40)  # a 40-token prompt: 10 blocks
    full, sliding = req.block_ids
    assert full == [b for b in full if b != NULL] and len(full) == 10
    # The first decode (position 40) sees keys 33..40: blocks 8, 9 and 10.
    for _ in range(1):
        req.append_output_token(7)
        _run(kv, req, 1)
    first = first_needed_block(WINDOW, 40, BS)
    assert first == 8
    full, sliding = req.block_ids
    assert len(full) == len(sliding) == 11
    assert all(b == NULL for b in sliding[:first]) and NULL not in sliding[first:]
    assert NULL not in full  # the global layer keeps every block
    assert kv.num_blocks_held("a") == 11 + 3
    assert kv.num_blocks_held("a") == kv.groups.blocks_held(41, BS)


def test_blocks_behind_the_window_are_free_for_others_and_none_leak():
    kv = _manager(num_blocks=24)
    req = _req("a", list(range(40)))
    _run(kv, req, 40)
    assert kv.pool.num_free_blocks == 24 - 20
    req.append_output_token(7)
    _run(kv, req, 1)  # the sliding group lets 8 of its 10 blocks go, takes one new
    assert kv.pool.num_free_blocks == 24 - 11 - 3
    other = _req("b", list(range(100, 120)))
    assert kv.allocate_slots(other, 20)  # 5 + 5 blocks: there thanks to the window alone
    kv.free(req)
    kv.free(other)
    assert kv.pool.num_free_blocks == 24 and not kv.blocks_by_key


def test_an_allocation_counts_the_blocks_it_gives_back_first():
    # A long chunk that needs more than is free, unless the window's passed blocks are
    # returned first: the allocation succeeds.
    kv = _manager(num_blocks=22)
    req = _req("a", list(range(80)))
    _run(kv, req, 40)  # 10 + 10 blocks, 2 free
    assert kv.pool.num_free_blocks == 2
    # 8 more tokens: 2 global blocks, 2 sliding ones; the sliding group gives back 8 first.
    _run(kv, req, 8)
    assert kv.num_blocks_held("a") == kv.groups.blocks_held(48, BS, 8)


def test_a_prefix_hit_needs_the_windows_blocks_only():
    kv = _manager()
    a = _req("a", list(range(40)))
    _run(kv, a, 40)
    kv.free(a)
    b = _req("b", list(range(40)) + [999])
    hits, n = kv.get_computed_blocks(b)
    assert n == 40
    full, sliding = hits
    assert len(full) == len(sliding) == 10 and None not in full
    # The first token to compute is 40: the sliding group needs keys 33..39 (blocks 8, 9).
    assert sliding[:8] == [None] * 8 and None not in sliding[8:]
    assert kv.allocate_slots(b, 1, hits)
    assert kv.num_blocks_held("b") == 11 + 3


def test_a_hit_is_cut_where_the_sliding_group_lost_a_block_its_window_needs():
    kv = _manager(num_blocks=20)
    a = _req("a", list(range(40)))
    _run(kv, a, 40)
    kv.free(a)
    b = _req("b", list(range(40)) + [999])
    hits, n = kv.get_computed_blocks(b)
    target = hits[1][9]
    assert target is not None
    kv.pool.uncache(target)  # as eviction does
    hits, n = kv.get_computed_blocks(b)
    # Block 9 of the sliding group is gone: a hit of 36 tokens needs blocks 7 and 8
    # (keys 29..35) and of the global layer blocks 0..8.
    assert n == 36
    assert hits[1][:7] == [None] * 7 and None not in hits[1][7:9]
    assert len(hits[0]) == 9 and None not in hits[0]


def test_the_global_group_decides_the_hit_when_it_lacks_a_block():
    kv = _manager()
    a = _req("a", list(range(40)))
    _run(kv, a, 40)
    kv.free(a)
    b = _req("b", list(range(40)) + [999])
    hits, _ = kv.get_computed_blocks(b)
    kv.pool.uncache(hits[0][3])
    hits, n = kv.get_computed_blocks(b)
    # Full attention needs every block: the hit stops before block 3; the sliding group then
    # needs blocks 1 and 2 (keys 5..11), which it still has.
    assert n == 12
    assert hits[1] == [None, hits[1][1], hits[1][2]] and None not in hits[1][1:]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory, smollm2_dir):
    return shared_tiny_model("gemma3_text", tmp_path_factory, smollm2_dir)


def test_an_engines_sliding_layers_hold_a_window_and_nothing_leaks(gemma):
    llm = make_llm(gemma, kv_cache_memory="4MiB", enable_prefix_caching=False)
    core = llm.llm_engine.engine_core
    groups = core.kv.groups
    assert [g.window for g in groups.groups] == [None] + [TINY_WINDOW] * 3  # 3:1, as Gemma 3
    held: list[tuple[int, int]] = []
    prompt = list(range(200, 300))
    core_step = core.step

    def step():  # the blocks the request holds after each step, and its length
        out = core_step()
        for req in core.scheduler.running:
            held.append((req.num_computed_tokens, core.kv.num_blocks_held(req.request_id)))
        return out

    core.step = step  # type: ignore[method-assign]
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    bs = core.kv.block_size
    for tokens, blocks in held[1:]:  # every decode: the planner's count
        assert blocks == groups.blocks_held(tokens, bs), (tokens, blocks)
    last_tokens, last_blocks = held[-1]
    # The global layers hold every block; the sliding one no more than its window needs.
    assert last_blocks < 2 * -(-last_tokens // bs)
    assert core.kv.pool.num_used_blocks == 0 and not core.kv.blocks_by_key


def test_the_planner_counts_what_the_pool_holds(gemma):
    spec = ModelSpec.from_json(gemma / "config.json")
    llm = make_llm(gemma, kv_cache_memory="4MiB", max_model_len=512)
    core = llm.llm_engine.engine_core
    plan = make_plan(spec, "tiny", 4 * 1024**2, "fp32", max_model_len=512, avg_tokens=200,
                     kv_cache_dtype="float32")
    # No weights in the planner's memory here: the same bytes go to the pool.
    plan = make_plan(spec, "tiny", 4 * 1024**2 + plan.weight_bytes, "fp32",
                     max_model_len=512, avg_tokens=200, kv_cache_dtype="float32")
    assert plan.num_blocks == core.kv.pool.num_blocks
    assert plan.block_bytes == core.bytes_per_token * core.kv.block_size
    assert plan.blocks_at_max_len == core.kv.groups.blocks_held(512, core.kv.block_size)
    stats = core.stats()
    assert stats.requests_that_fit(200) == pytest.approx(plan.concurrency_at_avg)
    # A sliding model fits more long chats than its full-attention twin would.
    assert plan.concurrency_at_max_len > plan.num_blocks / (2 * 512 // plan.block_size)
