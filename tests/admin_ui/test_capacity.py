"""The Capacity tab's arithmetic against engine.kv_plan and the contract's shapes."""

from __future__ import annotations

from admin_ui.capacity import (
    blocks_for,
    capacity_from_plan,
    capacity_from_stats,
    threads_that_fit,
    what_if,
)
from admin_ui.snapshot import StatsSnapshot
from tests.admin_ui.samples import stats_json, thread_json


def test_threads_hold_whole_blocks():
    assert blocks_for(1, 16) == 1 and blocks_for(16, 16) == 1 and blocks_for(17, 16) == 2
    assert threads_that_fit(100, 160, 16) == 10
    assert threads_that_fit(100, 161, 16) == 9  # 11 blocks each
    assert threads_that_fit(100, 0, 16) == 0


def test_from_stats_uses_average_of_active_threads():
    snap = StatsSnapshot.from_json(stats_json(blocks_total=100, threads=[
        thread_json("a", "1", 300, 3, 800), thread_json("b", "2", 100, 1, 800)]))
    c = capacity_from_stats(snap.model, snap.engine, snap.active_threads, 800)
    assert c.avg_thread_tokens == 200
    assert c.threads_at_avg == 100 // 13  # 200 tokens -> 13 blocks
    assert c.threads_at_cap == 100 // 50
    assert c.threads_at_max_len == 100 // 64
    assert c.pool_bytes == 1600 * 46080


def test_from_plan_trusts_the_server_and_fills_gaps():
    c = capacity_from_plan({"model": "m", "bytes_per_token": 57344, "kv_cache_tokens": 197520,
                            "num_blocks": 12345, "block_size": 16, "max_model_len": 32768,
                            "avg_thread_tokens": 4000, "threads_at_avg": 49.38,
                            "threads_at_cap": None, "cap": 8192})
    assert c.threads_at_avg == 49.38
    assert c.threads_at_cap == 12345 // 512


def test_what_if_matches_officellm_plan():
    plan = what_if("Qwen2.5-7B-Instruct", "80GiB")
    assert plan.bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57344  # docs/design.md §4
