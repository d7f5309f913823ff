"""docs/design.md §9's symptom table as pure rules over snapshot histories."""

from __future__ import annotations

from officellm.admin_ui.diagnosis import (
    LONG_PREFILL_TOKENS,
    OK,
    WARNING,
    diagnose,
    kv_cache_full,
    kv_cache_near_full,
    prefill_stall,
    slow_first_word,
    steady_batching,
)
from officellm.admin_ui.snapshot import StatsSnapshot
from tests.admin_ui.samples import stats_json, user_json


def history(*points: dict, step: float = 1.0) -> list[StatsSnapshot]:
    return [StatsSnapshot.from_json(stats_json(uptime=10 + i * step, **p), received=i * step)
            for i, p in enumerate(points)]


def test_rising_preemptions_say_the_cache_is_full():
    h = history(dict(preemptions=3, usage=0.8), dict(preemptions=3, usage=0.97),
                dict(preemptions=5, usage=1.0))
    f = kv_cache_full(h)
    assert f is not None and f.severity == WARNING
    assert "KV cache is full" in f.cause
    assert "lower per-user max context" in f.advice and "start new chats" in f.advice
    assert f.evidence[0].startswith("2 preemption(s)")
    assert diagnose(h)[0].rule == "kv_cache_full"


def test_old_preemptions_outside_the_window_are_not_news():
    flat = [dict(preemptions=7, usage=0.3)] * 5
    assert kv_cache_full(history(*flat)) is None
    # A rise 90 s ago, then a minute of calm: the window no longer sees it.
    h = history(dict(preemptions=1), dict(preemptions=7), *flat, step=30.0)
    assert kv_cache_full(h) is None


def test_high_usage_without_preemption_is_an_early_warning():
    h = history(dict(usage=0.5), dict(usage=0.95))
    assert kv_cache_near_full(h) is not None
    assert kv_cache_near_full(history(dict(usage=0.5), dict(usage=0.6))) is None
    # Once preemptions rise, the stronger finding replaces it.
    assert kv_cache_near_full(history(dict(usage=0.9, preemptions=0),
                                      dict(usage=0.95, preemptions=1))) is None


def test_itl_spike_during_long_prefill_gives_token_budget_advice():
    spike = (0.03, 0.6)
    h = history(dict(prompt_tokens=100, itl=spike),
                dict(prompt_tokens=100 + LONG_PREFILL_TOKENS + 1500, itl=spike))
    f = prefill_stall(h)
    assert f is not None and "--max-num-batched-tokens" in f.advice
    # The same spike without a long prompt taken in: not this cause.
    assert prefill_stall(history(dict(prompt_tokens=100, itl=spike),
                                 dict(prompt_tokens=180, itl=spike))) is None
    # A long prompt with steady ITL: not a stall.
    assert prefill_stall(history(dict(prompt_tokens=0, itl=(0.03, 0.05)),
                                 dict(prompt_tokens=5000, itl=(0.03, 0.05)))) is None


def test_steady_batching_is_reassuring():
    h = history(dict(running=3, itl=(0.05, 0.07)), dict(running=4, itl=(0.05, 0.08)))
    f = steady_batching(h)
    assert f is not None and f.severity == OK and "batching is doing its job" in f.cause
    assert steady_batching(history(dict(running=1, itl=(0.05, 0.07)),
                                   dict(running=1, itl=(0.05, 0.07)))) is None
    assert steady_batching(history(dict(running=4, itl=(0.05, 0.5)),
                                   dict(running=4, itl=(0.05, 0.5)))) is None


def test_slow_first_word():
    assert slow_first_word(history(dict(ttft=(3.0, 6.0), itl=(0.04, 0.06)))) is not None
    assert slow_first_word(history(dict(ttft=(0.3, 0.9), itl=(0.04, 0.06)))) is None


def test_quiet_server_gets_one_ok_row_and_empty_history_none():
    assert diagnose([]) == []
    rows = diagnose(history(dict(), dict()))
    assert [r.rule for r in rows] == ["quiet"]


def test_a_preemption_storm_names_the_user_holding_the_cache():
    alice = user_json("alice", 71, 0.71, 6, preempted=4)
    bob = user_json("bob", 9, 0.09, 1, preempted=1)
    h = history(dict(preemptions=3, usage=0.9, users=[user_json("alice", 60, 0.6, 5),
                                                       user_json("bob", 9, 0.09, 1)]),
                dict(preemptions=8, usage=1.0, users=[alice, bob]))
    f = kv_cache_full(h)
    assert f is not None
    assert "alice holds 71% of the KV cache in 6 running requests" in f.cause
    assert f.evidence[0] == "alice holds 71% of the KV cache in 6 running requests"
    assert "give alice a KV share cap or a lower priority" in f.advice
    assert "preempted: alice 4, bob 1" in f.evidence


def test_a_full_cache_shared_by_many_names_nobody():
    users = [user_json(f"u{i}", 10, 0.1, 1) for i in range(10)]
    h = history(dict(preemptions=3, usage=0.9, users=users),
                dict(preemptions=5, usage=1.0, users=users))
    f = kv_cache_full(h)
    assert f is not None and "holds" not in f.cause and "give" not in f.advice
