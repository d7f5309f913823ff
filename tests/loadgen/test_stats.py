"""Bench arithmetic without a server: percentiles, budgets, paste windows, /metrics parsing."""

from __future__ import annotations

import pytest

from officellm.app.observability.stats_window import StatsWindow
from officellm.app.percentiles import percentile
from officellm.loadgen import server_metrics, summary
from officellm.loadgen.budget import Budget
from officellm.loadgen.client import RequestRecord


def test_percentile_interpolates_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 100) == 4.0
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile([], 50) is None  # no samples: null, as in /admin/stats
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_bench_and_admin_stats_agree_on_the_same_samples() -> None:
    samples = [0.031, 0.2, 0.0125, 0.09, 0.045, 1.5, 0.07, 0.033, 0.061]
    window = StatsWindow(window_s=60)
    for s in samples:
        window.observe_latency("itl", s, now=10.0)
    server = window.latency(now=10.0)
    bench = summary.describe(samples)
    assert (server["itl_p50"], server["itl_p99"]) == (bench["p50"], bench["p99"])


def test_describe_is_ordered_and_empty_is_none() -> None:
    d = summary.describe([float(i) for i in range(1, 101)])
    assert d["count"] == 100 and d["mean"] == 50.5
    assert d["p50"] <= d["p90"] <= d["p99"] <= d["max"] == 100.0
    assert summary.describe([])["p50"] is None


def test_budget_counts_requests() -> None:
    b = Budget(requests=3, duration=None)
    assert [b.take() for _ in range(5)] == [True, True, True, False, False]
    with pytest.raises(ValueError):
        Budget(None, None)


def test_budget_deadline() -> None:
    b = Budget(requests=None, duration=0.0)
    assert b.exhausted() and not b.take()


def _chat(times: list[float]) -> RequestRecord:
    rec = RequestRecord(user=0, turn=0, kind="chat", start=0.0, max_tokens=10,
                        first_token=times[0], end=times[-1], chunk_times=times,
                        prompt_tokens=5, completion_tokens=len(times))
    return rec


def test_itl_during_paste_is_the_gap_that_spans_the_prefill() -> None:
    chat = _chat([1.0, 1.1, 1.2, 3.2, 3.3])  # froze from 1.2 to 3.2
    paste = RequestRecord(user=1, turn=0, kind="paste", start=1.25, max_tokens=4,
                          first_token=3.1, end=3.5, chunk_times=[3.1], prompt_tokens=900,
                          completion_tokens=1)
    out = summary.itl_around_pastes([chat, paste])
    assert out["itl_during_paste_s"]["count"] == 1
    assert out["itl_during_paste_s"]["max"] == pytest.approx(2.0)
    assert out["itl_without_paste_s"]["count"] == 3
    assert out["p99_during_over_p50_without"] == pytest.approx(20.0)


def test_a_chat_held_back_during_a_paste_counts_as_its_ttft() -> None:
    """Streaming nothing during the paste, it has no gaps there: its wait is its TTFT."""
    held = _chat([3.3, 3.4])
    held.start = 1.5
    before = _chat([1.0, 1.1])
    paste = RequestRecord(user=1, turn=0, kind="paste", start=1.25, max_tokens=4,
                          first_token=3.1, end=3.5, chunk_times=[3.1], prompt_tokens=900,
                          completion_tokens=1)
    out = summary.itl_around_pastes([held, before, paste])
    assert out["itl_during_paste_s"]["count"] == 0
    assert out["chat_ttft_during_paste_s"]["count"] == 1
    assert out["chat_ttft_during_paste_s"]["max"] == pytest.approx(1.8)


def test_tpot_uses_usage_tokens_not_chunks() -> None:
    rec = _chat([1.0, 2.0])
    rec.completion_tokens = 5  # two chunks carried five tokens
    assert rec.tpot == pytest.approx(0.25)


def test_timeline_spreads_usage_over_chunks() -> None:
    rec = _chat([0.5, 1.5])
    rec.completion_tokens = 4
    tl = summary.timeline([rec], t0=0.0, wall=2.0)
    assert [p["output_tok_per_s"] for p in tl] == [2.0, 2.0]


def test_parse_counters_sums_vllm_names() -> None:
    body = ('# TYPE vllm:num_preemptions counter\n'
            'vllm:num_preemptions_total{model_name="m"} 3.0\n'
            '# TYPE vllm:prefix_cache_hits counter\n'
            'vllm:prefix_cache_hits_total{model_name="m"} 30.0\n'
            '# TYPE vllm:prefix_cache_queries counter\n'
            'vllm:prefix_cache_queries_total{model_name="m"} 120.0\n'
            '# TYPE other gauge\nother 1.0\n')
    before = server_metrics.parse_counters(body)
    assert before == {"preemptions": 3.0, "prefix_cache_hits": 30.0, "prefix_cache_queries": 120.0}
    after = {k: v * 2 for k, v in before.items()}
    d = server_metrics.deltas(before, after)
    assert d["preemptions"] == 3.0 and d["prefix_cache_hit_rate"] == 0.25
    assert d["generation_tokens"] is None
    assert server_metrics.deltas(None, after)["prefix_cache_hit_rate"] is None


def test_noisy_neighbour_gives_the_heavy_user_its_own_key() -> None:
    from officellm.loadgen.runner import Target
    from officellm.loadgen.scenarios import ScenarioConfig

    config = ScenarioConfig("noisy-neighbour", users=3, heavy_requests=4)
    target = Target("http://x", api_key="shared", heavy_api_key="heavy",
                    light_api_keys=["a", "b"])
    assert config.heavy_user == 3
    assert target.user_keys(config) == {0: "a", 1: "b", 2: "a", 3: "heavy"}
    assert Target("http://x", api_key="shared").user_keys(config) == {}  # all use api_key
    ScenarioConfig("noisy-neighbour", users=0, heavy_requests=2)  # the heavy user alone
    ScenarioConfig("noisy-neighbour", users=2, heavy_requests=0)  # the light users alone
    with pytest.raises(ValueError):
        ScenarioConfig("noisy-neighbour", users=0, heavy_requests=0)


def test_code_edit_asks_to_rewrite_a_seeded_file_of_about_the_size_asked() -> None:
    import random

    from officellm.loadgen import text

    first = text.code_edit(random.Random("0-code-edit-1"), 600)
    again = text.code_edit(random.Random("0-code-edit-1"), 600)
    assert first == again  # the same seed, the same file
    body = first.split("```python\n", 1)[1]
    assert 1500 <= len(body) <= 2400  # ~600 tokens of code at ~3 characters each
    renamed = first.split("`", 2)[1]
    assert f"def {renamed}(" in body



def test_agent_instructions_are_the_same_for_every_agent_and_about_the_size_asked() -> None:
    from officellm.loadgen import text

    first, again = text.agent_instructions(800, seed=3), text.agent_instructions(800, seed=3)
    assert first == again and "read_file" in first
    assert 500 <= len(first.split()) * text.TOKENS_PER_WORD <= 900
