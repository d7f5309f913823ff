"""The engine's per-key numbers under user names: /admin/stats' `users`, /metrics'
officellm:kv_blocks_held and officellm:preemptions_total, the queue-time histogram, and the
scheduling tags the server hands the engine."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import generate_latest

from officellm.app.observability.metrics import ServerMetrics
from officellm.app.observability.sharing import preemptions_since, user_ids, user_shares
from officellm.app.policy import EffectivePolicy, prefix_cache_salt, scheduling_tags
from officellm.engine import kv_disk_owner
from officellm.engine.frontend.output_processor import IterationStats
from officellm.engine.stats import DiskTierStats, EngineStats

STATS = EngineStats(
    num_blocks_total=100, num_blocks_used=80, num_blocks_cached=0, kv_cache_usage=0.8,
    num_running=7, num_waiting=2, num_preemptions_total=5, prefix_cache_queries=0,
    prefix_cache_hits=0, prompt_tokens_total=0, generation_tokens_total=0,
    scheduling_policy="fair",
    kv_blocks_by_key={"3": 71, "4": 9}, running_by_key={"3": 6, "4": 1},
    preemptions_by_key={"3": 4, "9": 1, "": 0})
NAMES = {3: "alice", 4: "bob"}  # user 9 was deleted since


def test_user_shares_names_the_keys_heaviest_first():
    assert user_ids(STATS) == {3, 4, 9}
    rows = user_shares(STATS, NAMES)
    assert [(r.user, r.kv_blocks, r.kv_share, r.running, r.preemptions_total) for r in rows] == [
        ("alice", 71, 0.71, 6, 4), ("bob", 9, 0.09, 1, 0), ("(none)", 0, 0.0, 0, 0),
        ("user 9", 0, 0.0, 0, 1)]


def test_user_shares_say_what_of_each_users_own_salt_the_disk_tier_keeps():
    secret = bytes(range(32))
    alice, shared = (kv_disk_owner(secret, prefix_cache_salt(3, share_prefix_cache=False)),
                     kv_disk_owner(secret, None))
    disk = DiskTierStats(files=3, bytes_used=3000, capacity_bytes=10**6, blocks_written=3,
                         blocks_read=0, blocks_unreadable=0, writes_dropped=0, writable=True,
                         bytes_by_owner={alice: 2000, shared: 1000})
    rows = user_shares(replace(STATS, kv_disk=disk), NAMES,
                       lambda uid: kv_disk_owner(secret, prefix_cache_salt(uid, False)))
    assert {r.user: r.kv_disk_bytes for r in rows} == {"alice": 2000, "bob": 0, "(none)": 0,
                                                        "user 9": 0}


def test_preemptions_since_counts_only_the_new_ones_per_user():
    before = replace(STATS, preemptions_by_key={"3": 1})
    assert preemptions_since(before, STATS, NAMES) == {"alice": 3, "user 9": 1}
    assert preemptions_since(STATS, STATS, NAMES) == {}


def test_scheduling_tags_are_the_user_id_the_priority_weight_and_the_cap():
    tags = scheduling_tags(3, EffectivePolicy(priority="high", max_kv_share=0.5))
    assert (tags.fairness_key, tags.priority, tags.max_kv_share) == ("3", 2.0, 0.5)
    low = scheduling_tags(4, EffectivePolicy(priority="low"))
    assert (low.priority, low.max_kv_share) == (0.5, None)


class _Engine:
    def stats(self) -> EngineStats:
        return STATS


def test_metrics_export_blocks_and_preemptions_per_user_and_queue_time():
    metrics = ServerMetrics(lambda: [("m", _Engine())], lambda: "m")  # type: ignore[list-item]
    metrics.track_sharing(lambda ids: {i: NAMES[i] for i in ids if i in NAMES})
    metrics.latency_tracker(lambda: "m").on_step(IterationStats(ttft=[0.5], queue=[0.25]), 0.0)
    text = generate_latest(metrics.registry).decode()
    assert 'officellm:kv_blocks_held{model_name="m",user="alice"} 71.0' in text
    assert 'officellm:kv_blocks_held{model_name="m",user="bob"} 9.0' in text
    assert 'officellm:preemptions_total{model_name="m",user="alice"} 4.0' in text
    assert 'officellm:preemptions_total{model_name="m",user="user 9"} 1.0' in text
    assert 'vllm:request_queue_time_seconds_count{model_name="m"} 1.0' in text
    assert 'vllm:request_queue_time_seconds_sum{model_name="m"} 0.25' in text
