"""The KV cache's host tier: blocks that leave the pool (evicted, or a preempted sequence's)
are copied back from RAM instead of computed, with the same answer; above the disk tier,
per salt, purgeable, within its slots."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from officellm.engine import EngineConfig, SamplingParams, estimate_footprint
from officellm.engine.kv_offload.host_tier import HostTier
from tests.engine.conftest import make_llm
from tests.support.engine_requests import greedy_alone, random_prompt
from tests.support.tiny_models import shared_tiny_model

BLOCK = 16
# The tiny llama's KV per token: K and V, 3 layers, 2 KV heads of 8, float32.
PER_TOKEN = 2 * 3 * 2 * 8 * 4
BLOCK_BYTES = BLOCK * PER_TOKEN


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, smollm2_dir) -> Path:
    return shared_tiny_model("llama", tmp_path_factory, smollm2_dir)


def _prompt(seed: int, length: int = 5 * BLOCK + 3) -> list[int]:
    return random_prompt(seed, length)




def _small_pool(blocks: int = 7, **kwargs):
    """An engine whose pool holds one request of six blocks and little more, so each new
    prompt evicts the one before; a host tier of 64 blocks under it."""
    kwargs.setdefault("kv_offloading_size", f"{64 * BLOCK_BYTES}B")
    return kwargs | {"kv_cache_memory": blocks * BLOCK_BYTES}


def _logprobs(out) -> list[float]:
    return [lp[t].logprob for lp, t in zip(out.logprobs, out.token_ids, strict=True)]


def test_a_prefix_evicted_from_the_pool_is_copied_back_from_ram_with_the_same_answer(
        tiny_llama):
    first, others = _prompt(1), [_prompt(2), _prompt(3)]
    with make_llm(tiny_llama, **_small_pool()) as llm:
        cold = greedy_alone(llm, first)
        for prompt in others:  # each evicts the one before from the pool
            greedy_alone(llm, prompt)
        warm = greedy_alone(llm, first)
        stats = llm.llm_engine.stats()
    assert warm.token_ids == cold.token_ids
    assert stats.kv_tier_hits == 5 * BLOCK
    assert stats.kv_host is not None and stats.kv_host.blocks_read == 5
    assert stats.kv_disk is None


def test_under_batch_invariance_a_prefix_from_ram_gives_bit_identical_logprobs(tiny_llama):
    first, other = _prompt(4), _prompt(5)
    with make_llm(tiny_llama, batch_invariant=True) as plain:
        expected = greedy_alone(plain, first)
    with make_llm(tiny_llama, batch_invariant=True, **_small_pool()) as llm:
        greedy_alone(llm, first)
        greedy_alone(llm, other)
        warm = greedy_alone(llm, first)
        stats = llm.llm_engine.stats()
    # The pool kept one of its blocks; RAM gave the other four.
    assert stats.kv_tier_hits == 4 * BLOCK
    assert stats.prefix_cache_hits == BLOCK
    assert warm.token_ids == expected.token_ids
    assert _logprobs(warm) == _logprobs(expected)


def test_preempted_sequences_are_copied_back_from_ram_instead_of_computed_again(tiny_llama):
    prompts = [_prompt(20 + i, 3 * BLOCK + 4) for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=3 * BLOCK, ignore_eos=True)
    with make_llm(tiny_llama) as alone:
        expected = [out.outputs[0].token_ids for out in alone.generate(prompts, params)]
    # Room for every prompt at admission and a block more, not for all of them grown by
    # three blocks: they preempt each other, and their blocks are evicted meanwhile.
    pool = 4 * 4 + 1
    with make_llm(tiny_llama, kv_cache_memory=pool * BLOCK_BYTES) as recompute:
        recompute.generate(prompts, params)
        recomputed = recompute.llm_engine.stats()
    with make_llm(tiny_llama, **_small_pool(pool)) as llm:
        outputs = llm.generate(prompts, params)
        swapped = llm.llm_engine.stats()
    assert [out.outputs[0].token_ids for out in outputs] == expected
    assert recomputed.num_preemptions_total > 0 and swapped.num_preemptions_total > 0
    assert swapped.kv_tier_hits > 0
    # Only each preempted sequence's last, partial block is computed again.
    assert swapped.prompt_tokens_computed_total < recomputed.prompt_tokens_computed_total


def test_ram_serves_what_it_holds_and_the_disk_the_rest(tiny_llama, tmp_path):
    prompts = [_prompt(30 + i) for i in range(3)]
    # Eight slots: after three prompts of five blocks, RAM holds the newest eight blocks.
    with make_llm(tiny_llama, kv_disk_dir=str(tmp_path), kv_disk_key=bytes(32),
                  **_small_pool(kv_offloading_size=f"{8 * BLOCK_BYTES}B")) as llm:
        cold = [greedy_alone(llm, p) for p in prompts]
        assert llm.llm_engine.engine_core.kv_tiers.disk.flush()
        warm = greedy_alone(llm, prompts[1])
        stats = llm.llm_engine.stats()
    assert warm.token_ids == cold[1].token_ids
    assert stats.kv_host is not None and stats.kv_disk is not None
    assert stats.kv_host.blocks_read >= 1 and stats.kv_disk.blocks_read >= 1
    assert stats.kv_host.blocks_evicted == 3 * 5 - 8


def test_another_salt_never_hits_a_persons_blocks_in_ram(tiny_llama):
    prompt = _prompt(40)
    with make_llm(tiny_llama, **_small_pool()) as llm:
        greedy_alone(llm, prompt, salt="alice")
        greedy_alone(llm, _prompt(41))  # evicts alice's from the pool
        greedy_alone(llm, prompt, salt="bob")
        assert llm.llm_engine.stats().kv_tier_hits == 0
        greedy_alone(llm, _prompt(42))
        greedy_alone(llm, prompt, salt="alice")
        assert llm.llm_engine.stats().kv_tier_hits == 5 * BLOCK


def test_purging_a_salt_forgets_its_blocks_in_ram(tiny_llama):
    prompt = _prompt(50)
    with make_llm(tiny_llama, **_small_pool()) as llm:
        greedy_alone(llm, prompt, salt="alice")
        greedy_alone(llm, _prompt(51), salt="bob")
        core = llm.llm_engine.engine_core
        held = core.kv_tiers.host.stats().blocks
        core.purge_cache_salt("alice")
        assert core.kv_tiers.host.stats().blocks == held - 5
        greedy_alone(llm, prompt, salt="alice")
        assert llm.llm_engine.stats().kv_tier_hits == 0


def test_the_host_tier_keeps_its_slots_least_recently_used_out_first():
    tier = HostTier(3 * 8, block_bytes=8, pinned=False)
    for i in range(3):
        tier.put(bytes([i]), None, bytes([i]) * 8)
    assert tier.view(bytes([0])) is not None  # used: now the most recent
    tier.put(bytes([3]), None, bytes([3]) * 8)
    assert not tier.holds(bytes([1]))
    assert [tier.holds(bytes([k])) for k in (0, 2, 3)] == [True, True, True]
    assert bytes(tier.view(bytes([3]))) == bytes([3]) * 8
    assert tier.stats().blocks_evicted == 1


def test_a_purged_blocks_bytes_do_not_stay_in_ram():
    tier = HostTier(2 * 8, block_bytes=8, pinned=False)
    tier.put(b"a", "alice", b"secret!!")
    tier.put(b"b", "bob", b"public!!")
    assert tier.purge("alice") == 1
    assert not tier.holds(b"a")
    assert b"secret" not in np.asarray(tier._slab).tobytes()


def test_copying_back_is_priced_from_the_tiers_own_copies():
    tier = HostTier(4 * 1024, block_bytes=1024, pinned=False)
    assert tier.copy_seconds(10) is None
    tier.put(b"k", None, bytes(1024))
    seconds = tier.copy_seconds(10)
    assert seconds is not None and seconds > 0


@pytest.mark.parametrize(("value", "expected"), [
    ("8", 8 * 1024**3), ("2.5", int(2.5 * 1024**3)), ("512MiB", 512 * 1024**2),
    (4096, 4096), ("auto", "auto"), ("off", None), ("0", None), (None, None)])
def test_kv_offloading_size_reads_gib_as_vllm_does_or_a_size_with_its_unit(value, expected):
    assert EngineConfig(kv_offloading_size=value).kv_offloading_size == expected


def test_kv_offloading_size_reads_the_same_when_the_config_is_copied():
    config = EngineConfig(kv_offloading_size="8")
    assert replace(config).kv_offloading_size == 8 * 1024**3


def test_the_host_tier_needs_one_rank():
    with pytest.raises(ValueError, match="tensor_parallel_size 1"):
        EngineConfig(kv_offloading_size="1GiB", tensor_parallel_size=2)


def test_auto_keeps_no_host_tier_on_the_cpu_whose_pool_is_in_ram():
    footprint = estimate_footprint(EngineConfig(kv_offloading_size="auto",
                                                kv_cache_memory="64MiB"))
    assert footprint.tier_ram_bytes == 0


def test_on_the_cpu_the_host_tier_counts_in_the_memory_budget():
    plain = estimate_footprint(EngineConfig(kv_cache_memory="64MiB"))
    tiered = estimate_footprint(EngineConfig(kv_cache_memory="64MiB",
                                             kv_offloading_size="1GiB"))
    assert tiered.tier_ram_bytes == 1024**3
    assert tiered.total_bytes == plain.total_bytes + 1024**3


def test_blocks_copied_in_from_one_buffer_or_many_land_in_their_own_pool_blocks(tiny_llama):
    with make_llm(tiny_llama) as llm:
        runner = llm.llm_engine.engine_core.runner
        size = runner.block_bytes
        rng = np.random.default_rng(0)
        together = rng.integers(0, 255, 3 * size, dtype=np.uint8)  # three back to back
        apart = [rng.integers(0, 255, size, dtype=np.uint8) for _ in range(2)]
        # Back to back in memory but not in the order of the pool blocks, then two alone.
        payloads = [memoryview(together[size:2 * size]), memoryview(together[2 * size:]),
                    memoryview(apart[0]), memoryview(together[:size]), memoryview(apart[1])]
        block_ids = [7, 3, 11, 5, 2]
        runner.write_blocks(block_ids, payloads)
        read = runner.read_blocks(block_ids).payloads()
    assert [bytes(r) for r in read] == [bytes(p) for p in payloads]
