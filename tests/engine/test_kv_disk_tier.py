"""The KV cache's disk tier: a prompt's prefix computed once is read back after a restart
instead of computed again, with the same answer; per salt, sealed, and a miss (never a wrong
answer) when a file is damaged, foreign or gone."""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from officellm.engine import OutputKind, SamplingParams, kv_disk_owner
from officellm.engine.kv_offload.disk_tier import SUFFIX, DiskTier
from tests.engine.conftest import make_llm
from tests.support.engine_requests import greedy_alone, random_prompt
from tests.support.tiny_models import shared_tiny_model

KEY = bytes(range(32))
BLOCK = 16


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, smollm2_dir) -> Path:
    return shared_tiny_model("llama", tmp_path_factory, smollm2_dir)


def _prompt(seed: int, length: int = 5 * BLOCK + 3) -> list[int]:
    return random_prompt(seed, length)


def _llm(model: Path, disk: Path, **kwargs):
    kwargs.setdefault("kv_disk_key", KEY)
    return make_llm(model, kv_disk_dir=str(disk), **kwargs)




def _block_files(disk: Path) -> list[Path]:
    return sorted(disk.rglob(f"*{SUFFIX}"))


def test_a_restarted_engine_reads_the_prompt_from_disk_and_answers_the_same(tiny_llama,
                                                                              tmp_path):
    prompt = _prompt(1)
    with _llm(tiny_llama, tmp_path) as first:
        cold = greedy_alone(first, prompt)
        assert first.llm_engine.stats().kv_tier_hits == 0
    assert len(_block_files(tmp_path)) >= 5  # the prompt's five full blocks, at least
    with _llm(tiny_llama, tmp_path) as second:
        warm = greedy_alone(second, prompt)
        stats = second.llm_engine.stats()
    assert warm.token_ids == cold.token_ids
    assert stats.kv_tier_hits == 5 * BLOCK
    assert stats.prefix_cache_hits == 0  # the pool's hits alone, as vLLM counts them
    assert stats.kv_disk is not None and stats.kv_disk.blocks_read == 5


def test_under_batch_invariance_a_prefix_read_from_disk_gives_bit_identical_logprobs(
        tiny_llama, tmp_path):
    prompt = _prompt(2)
    with _llm(tiny_llama, tmp_path, batch_invariant=True) as first:
        cold = greedy_alone(first, prompt)
    with _llm(tiny_llama, tmp_path, batch_invariant=True) as second:
        warm = greedy_alone(second, prompt)
        assert second.llm_engine.stats().kv_tier_hits == 5 * BLOCK
    assert warm.token_ids == cold.token_ids
    assert [lp[t].logprob for lp, t in zip(warm.logprobs, warm.token_ids)] == \
        [lp[t].logprob for lp, t in zip(cold.logprobs, cold.token_ids)]


def test_a_hybrid_models_sliding_layers_are_read_back_too(tmp_path_factory, smollm2_dir,
                                                           tmp_path):
    model = shared_tiny_model("gemma3_text", tmp_path_factory, smollm2_dir)
    prompt = _prompt(3, 6 * BLOCK + 5)
    with _llm(model, tmp_path) as first:
        cold = greedy_alone(first, prompt)
    with _llm(model, tmp_path) as second:
        warm = greedy_alone(second, prompt)
        assert second.llm_engine.stats().kv_tier_hits > 0
    assert warm.token_ids == cold.token_ids


def test_requests_preempting_each_other_resume_from_disk_with_the_same_answers(tiny_llama,
                                                                            tmp_path):
    prompts = [_prompt(20 + i, 3 * BLOCK + 4) for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=3 * BLOCK, ignore_eos=True)
    with make_llm(tiny_llama) as alone:
        expected = [out.outputs[0].token_ids for out in alone.generate(prompts, params)]
    per_token = 2 * 3 * 2 * 8 * 4  # K and V, 3 layers, 2 KV heads of 8, float32
    # Room for every prompt at admission and a block more, not for all of them grown by
    # three blocks: they preempt each other, and their blocks are evicted meanwhile.
    blocks = 4 * 4 + 1
    with _llm(tiny_llama, tmp_path, kv_cache_memory=blocks * BLOCK * per_token) as llm:
        outputs = llm.generate(prompts, params)
        stats = llm.llm_engine.stats()
    assert [out.outputs[0].token_ids for out in outputs] == expected
    assert stats.num_preemptions_total > 0
    assert stats.kv_tier_hits > 0


def test_a_prefix_is_computed_where_reading_it_is_measured_slower(tiny_llama, tmp_path):
    first_prompt, second_prompt = _prompt(12), _prompt(13)
    with _llm(tiny_llama, tmp_path) as first:
        expected = greedy_alone(first, second_prompt).token_ids
        greedy_alone(first, first_prompt)
    with _llm(tiny_llama, tmp_path) as second:
        greedy_alone(second, first_prompt)  # read from disk: the read is measured
        core = second.llm_engine.engine_core
        core.kv.prefill_seconds = lambda tokens: 0.0  # as if computing cost nothing
        assert greedy_alone(second, second_prompt).token_ids == expected
        stats = second.llm_engine.stats()
    assert stats.kv_tier_hits == 5 * BLOCK  # the first prompt's, not the second's
    assert stats.kv_disk is not None and stats.kv_disk.blocks_read == 5


def test_a_request_gone_while_its_prefix_is_read_gives_its_blocks_back(tiny_llama, tmp_path):
    prompt = _prompt(15)
    with _llm(tiny_llama, tmp_path) as first:
        greedy_alone(first, prompt)
    with _llm(tiny_llama, tmp_path) as llm:
        engine, core = llm.llm_engine, llm.llm_engine.engine_core
        engine.add_request("leaving", prompt, SamplingParams(temperature=0.0, max_tokens=4))
        engine.step()  # five pool blocks set aside; the readers copy its prefix into them
        assert core.kv.num_loading == 1
        assert core.kv.pool.num_used_blocks == 5
        assert engine.abort_request("leaving")
        assert core.kv.num_loading == 0
        assert core.kv.pool.num_used_blocks == 0
        assert not core.kv_tiers.reading()
        # What was copied in before it left is no hit for anyone: its blocks hold no key.
        assert core.kv.pool.num_cached_blocks == 0


def test_a_purge_while_a_persons_prefix_is_read_leaves_none_of_it_cached(tiny_llama, tmp_path):
    prompt = _prompt(18)
    with _llm(tiny_llama, tmp_path) as first:
        expected = greedy_alone(first, prompt, salt="alice").token_ids
    with _llm(tiny_llama, tmp_path) as llm:
        engine, core = llm.llm_engine, llm.llm_engine.engine_core
        engine.add_request("alice", prompt, SamplingParams(temperature=0.0, max_tokens=8),
                           cache_salt="alice", output_kind=OutputKind.FINAL)
        engine.step()  # her prefix is being copied in
        assert core.kv.num_loading == 1
        core.purge_cache_salt("alice")
        done = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                done = out if out.finished else done
        assert done is not None and done.outputs[0].token_ids == expected  # computed anew
        assert engine.stats().kv_tier_hits == 0
        # Only what her request computed after the purge is cached: its own blocks.
        assert core.kv.pool.num_cached_blocks == len(prompt + expected) // BLOCK


def test_a_prefix_read_while_the_pool_is_full_waits_then_is_admitted(tiny_llama, tmp_path):
    prompt = _prompt(17)
    with _llm(tiny_llama, tmp_path) as first:
        expected = greedy_alone(first, prompt).token_ids
    per_block = 2 * 3 * BLOCK * 2 * 8 * 4  # K and V, 3 layers, 2 KV heads of 8, float32
    with _llm(tiny_llama, tmp_path, kv_cache_memory=10 * per_block, max_model_len=128) as llm:
        engine = llm.llm_engine
        params = SamplingParams(temperature=0.0, max_tokens=8)
        engine.add_request("busy", _prompt(16, 6 * BLOCK), SamplingParams(
            temperature=0.0, max_tokens=2 * BLOCK, ignore_eos=True))  # most of the pool
        engine.step()
        engine.add_request("waiting", prompt, params, output_kind=OutputKind.FINAL)
        outputs = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    outputs[out.request_id] = out.outputs[0].token_ids
    assert outputs["waiting"] == expected
    assert engine.stats().kv_tier_hits == 5 * BLOCK


def test_another_salt_never_reads_a_persons_blocks(tiny_llama, tmp_path):
    prompt = _prompt(4)
    with _llm(tiny_llama, tmp_path) as first:
        greedy_alone(first, prompt, salt="alice")
    with _llm(tiny_llama, tmp_path) as second:
        greedy_alone(second, prompt, salt="bob")
        assert second.llm_engine.stats().kv_tier_hits == 0
        greedy_alone(second, prompt, salt="alice")
        assert second.llm_engine.stats().kv_tier_hits == 5 * BLOCK


def test_blocks_sealed_under_another_key_are_never_read(tiny_llama, tmp_path):
    prompt = _prompt(5)
    with _llm(tiny_llama, tmp_path) as first:
        cold = greedy_alone(first, prompt)
    with _llm(tiny_llama, tmp_path, kv_disk_key=b"another install's secret") as second:
        assert greedy_alone(second, prompt).token_ids == cold.token_ids
        assert second.llm_engine.stats().kv_tier_hits == 0


def test_no_file_holds_the_prompts_tokens_text_or_kv_in_clear(tiny_llama, tmp_path,
                                                              smollm2_tokenizer):
    text = "Quarterly figures for the Rotterdam office, strictly confidential. " * 4
    prompt = smollm2_tokenizer(text)["input_ids"]
    with _llm(tiny_llama, tmp_path) as llm:
        greedy_alone(llm, prompt, salt="alice")
        core = llm.llm_engine.engine_core
        blocks = [b.block_id for b in core.kv.pool.blocks if b.block_hash is not None]
        kv_in_clear = core.runner.read_blocks(blocks).payloads()
    files = _block_files(tmp_path)
    assert files
    names = " ".join(str(p.relative_to(tmp_path)) for p in files)
    assert "alice" not in names
    for path in files:
        data = path.read_bytes()
        assert text[:20].encode() not in data
        assert struct.pack(f"<{BLOCK}q", *prompt[:BLOCK]) not in data
        assert struct.pack(f"<{BLOCK}i", *prompt[:BLOCK]) not in data
        assert not any(kv[:64] in data for kv in kv_in_clear)


@pytest.mark.parametrize("damage", ["flipped", "truncated", "empty", "foreign"])
def test_a_damaged_block_file_is_a_miss_and_changes_no_answer(tiny_llama, tmp_path, damage,
                                                               caplog):
    prompt = _prompt(6)
    with _llm(tiny_llama, tmp_path) as first:
        cold = greedy_alone(first, prompt)
    files = _block_files(tmp_path)
    victim = files[len(files) // 2]
    data = victim.read_bytes()
    if damage == "flipped":
        victim.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "truncated":
        victim.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        victim.write_bytes(b"")
    else:  # another block's file under this one's name
        other = next(p for p in files if p != victim)
        shutil.copy(other, victim)
    with caplog.at_level(logging.WARNING), _llm(tiny_llama, tmp_path) as second:
        warm = greedy_alone(second, prompt)
        stats = second.llm_engine.stats()
    assert warm.token_ids == cold.token_ids
    assert stats.kv_disk is not None and stats.kv_disk.blocks_unreadable == 1
    assert stats.kv_tier_hits < 5 * BLOCK
    assert "unreadable" in caplog.text
    with _llm(tiny_llama, tmp_path) as third:  # the damaged block was computed and saved anew
        assert greedy_alone(third, prompt).token_ids == cold.token_ids
        assert third.llm_engine.stats().kv_tier_hits == 5 * BLOCK


def test_an_unwritable_directory_turns_writing_off_and_serving_goes_on(tiny_llama, tmp_path,
                                                                      caplog):
    not_a_dir = tmp_path / "a file"
    not_a_dir.write_text("in the way")
    prompt = _prompt(7)
    with caplog.at_level(logging.WARNING), _llm(tiny_llama, not_a_dir) as llm:
        first = greedy_alone(llm, prompt)
        again = greedy_alone(llm, prompt)  # the pool's prefix cache still serves
        stats = llm.llm_engine.stats()
    assert first.token_ids == again.token_ids
    assert stats.kv_disk is not None and not stats.kv_disk.writable
    assert stats.prefix_cache_hits == 5 * BLOCK
    assert "no more blocks are saved" in caplog.text


def test_a_full_disk_turns_writing_off_leaves_no_partial_file_and_serving_goes_on(
        tiny_llama, tmp_path):
    """In a process of its own whose files may not grow past 1 KB (RLIMIT_FSIZE): each
    block's write fails part-way, as on a full disk (EFBIG there, ENOSPC here)."""
    child = textwrap.dedent(f"""
        import json, resource, signal
        from officellm.engine import LLM, SamplingParams
        llm = LLM({str(tiny_llama)!r}, dtype="float32", quantization="none",
                  kv_cache_dtype="float32", kv_cache_memory="64MiB",
                  kv_disk_dir={str(tmp_path)!r}, kv_disk_key={KEY!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE,
                           (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        params = SamplingParams(temperature=0.0, max_tokens=8)
        first = llm.generate([{_prompt(14)!r}], params)[0].outputs[0].token_ids
        llm.llm_engine.engine_core.kv_tiers.disk.flush()
        again = llm.generate([{_prompt(14)!r}], params)[0].outputs[0].token_ids
        disk = llm.llm_engine.stats().kv_disk
        print(json.dumps({{"same": first == again, "writable": disk.writable,
                           "files": disk.files, "bytes": disk.bytes_used}}))
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"same": True, "writable": False,
                                                         "files": 0, "bytes": 0}
    assert "no more blocks are saved" in done.stderr
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # no partial file left


def test_a_directory_removed_while_serving_is_made_again(tiny_llama, tmp_path):
    with _llm(tiny_llama, tmp_path) as llm:
        greedy_alone(llm, _prompt(8))
    with _llm(tiny_llama, tmp_path) as llm:
        shutil.rmtree(tmp_path)
        greedy_alone(llm, _prompt(9))
        tier = llm.llm_engine.engine_core.kv_tiers.disk
    assert tier.stats().writable
    assert len(_block_files(tmp_path)) == 5


def test_purging_a_salt_forgets_its_blocks_in_the_pool_and_on_disk(tiny_llama, tmp_path):
    prompt = _prompt(10)
    with _llm(tiny_llama, tmp_path) as llm:
        greedy_alone(llm, prompt, salt="alice")
        greedy_alone(llm, _prompt(11), salt="bob")
        core = llm.llm_engine.engine_core
        assert core.kv_tiers.disk.flush()  # every write on disk before the purge
        bobs = len(_block_files(tmp_path)) - 5
        owners = core.kv_tiers.disk.stats().bytes_by_owner
        assert set(owners) == {kv_disk_owner(KEY, "alice"), kv_disk_owner(KEY, "bob")}
        assert core.purge_cache_salt("alice") >= 5
        assert set(core.kv_tiers.disk.stats().bytes_by_owner) == {kv_disk_owner(KEY, "bob")}
        before = llm.llm_engine.stats()
        greedy_alone(llm, prompt, salt="alice")
        after = llm.llm_engine.stats()
        assert (after.prefix_cache_hits, after.kv_tier_hits) == \
            (before.prefix_cache_hits, before.kv_tier_hits)
    assert len(_block_files(tmp_path)) == bobs + 5  # bob's, and alice's prompt written again


# -- the tier alone ----------------------------------------------------------------------

class _Pool:
    """Stands in for the KV pool: the blocks a tier copies in, by block id."""

    def __init__(self) -> None:
        self.blocks: dict[int, bytes] = {}

    def place(self, block_ids: list[int], payloads: list[memoryview]) -> None:
        self.blocks.update((i, bytes(p)) for i, p in zip(block_ids, payloads, strict=True))


# The tiers below copy into this one: a test reads from one tier at a time.
_POOL = _Pool()


def _tier(root: Path, capacity: int = 1 << 30, ttl: float | None = None) -> DiskTier:
    return DiskTier(root, b"model", KEY, capacity, block_bytes=1000, ttl_seconds=ttl,
                    place=_POOL.place)


def _put_all(tier: DiskTier, keys: list[bytes]) -> None:
    for key in keys:
        tier.put(key, None, key * (1000 // len(key)))
    tier.close()


def _read(tier: DiskTier, keys: list[bytes]) -> list[bytes | None]:
    """Each block's bytes as copied into the pool, or None where it could not be read."""
    _POOL.blocks.clear()
    while (copied := tier.fetch("r", keys, list(range(len(keys))))) is None:
        tier.wait_for_reads(0.05)
    tier.release("r")
    return [_POOL.blocks[i] if ok else None for i, ok in enumerate(copied)]


def test_the_tier_keeps_within_its_budget_least_recently_used_out_first(tmp_path):
    keys = [bytes([i]) * 10 for i in range(6)]
    _put_all(_tier(tmp_path), keys[:3])
    now = time.time()
    for age, key in zip((30, 20, 10), keys):  # written in this order
        os.utime(_file_of(tmp_path, key), (now - age, now - age))
    size = _block_files(tmp_path)[0].stat().st_size
    reread = _tier(tmp_path, capacity=4 * size)
    assert _read(reread, [keys[0]]) == [keys[0] * 100]  # key 0 used after 1 and 2
    _put_all(reread, keys[3:5])
    kept = _tier(tmp_path, capacity=4 * size)
    assert [kept.holds(k) for k in keys] == [True, False, True, True, True, False]
    assert kept.stats().bytes_used == sum(p.stat().st_size for p in _block_files(tmp_path))
    kept.close()


def test_blocks_unused_past_the_retention_time_are_removed(tmp_path):
    keys = [b"old block.", b"new block."]
    _put_all(_tier(tmp_path), keys)
    week_ago = time.time() - 8 * 86400
    old = _file_of(tmp_path, keys[0])
    os.utime(old, (week_ago, week_ago))
    tier = _tier(tmp_path, ttl=7 * 86400)
    assert not tier.holds(keys[0]) and tier.holds(keys[1])
    assert not old.exists()
    tier.close()


def _file_of(root: Path, key: bytes) -> Path:
    tier = _tier(root)
    name = tier._name(key)
    tier.close()
    return next(p for p in _block_files(root) if p.name == name + SUFFIX)


def test_two_processes_writing_one_block_leave_one_whole_file(tmp_path):
    payload = os.urandom(1000)
    tiers = [_tier(tmp_path) for _ in range(4)]
    threads = [threading.Thread(target=lambda t=t: (t.put(b"k" * 8, None, payload), t.close()))
               for t in tiers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(list(tmp_path.rglob("*"))) == 3  # model folder, owner folder, one file
    assert _read(_tier(tmp_path), [b"k" * 8]) == [payload]
