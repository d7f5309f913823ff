"""Parsing /admin/stats leniently and keeping a short history of it."""

from __future__ import annotations

from officellm.admin_ui.history import StatsHistory
from officellm.admin_ui.snapshot import StatsSnapshot
from tests.admin_ui.samples import stats_json, thread_json


def test_parses_contract_shape():
    snap = StatsSnapshot.from_json(stats_json(
        usage=0.42, running=3, waiting=1, preemptions=2, queries=200, hits=150,
        itl=(0.02, 0.05), threads=[thread_json("alice", "abc", 1200, 4, 4096),
                                   thread_json("bob", "def", 50, 1, None)]))
    assert snap.engine.kv_cache_usage == 0.42
    assert snap.engine.num_running == 3 and snap.engine.num_waiting == 1
    assert snap.engine.num_preemptions_total == 2
    assert snap.engine.prefix_hit_rate == 0.75
    assert snap.latency.itl_p99 == 0.05 and snap.latency.ttft_p50 is None
    alice, bob = snap.active_threads
    assert alice.fraction_of_cap == 1200 / 4096
    assert bob.cap is None and bob.fraction_of_cap is None


def test_missing_fields_read_as_zero():
    snap = StatsSnapshot.from_json({"model": "m", "engine": {"num_running": 2}})
    assert snap.engine.num_running == 2
    assert snap.engine.kv_cache_usage == 0.0
    assert snap.engine.prefix_hit_rate is None
    assert snap.active_threads == []


def _snap(t: float, preemptions: int, uptime: float | None = None) -> StatsSnapshot:
    return StatsSnapshot.from_json(stats_json(preemptions=preemptions,
                                              uptime=t if uptime is None else uptime), received=t)


def test_history_windows_and_preemptions():
    h = StatsHistory(max_age_s=100)
    for t in range(0, 200, 10):
        h.add(_snap(float(t), preemptions=t // 10))
    assert len(h) == 11  # 90..190 inclusive, older dropped
    assert h.preemptions_in(30) == 3
    assert [s.received for s in h.within(20)] == [170.0, 180.0, 190.0]


def test_restarted_server_starts_a_fresh_history():
    h = StatsHistory()
    h.add(_snap(1.0, preemptions=50, uptime=500.0))
    h.add(_snap(2.0, preemptions=51, uptime=501.0))
    h.add(_snap(3.0, preemptions=0, uptime=1.0))  # counters back to zero
    assert len(h) == 1
    assert h.preemptions_in(60) == 0
