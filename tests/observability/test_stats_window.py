"""StatsWindow: rates, latency percentiles and preemption deltas over a sliding window."""

from __future__ import annotations

import pytest

from officellm.app.observability.model_windows import ModelWindows
from officellm.app.observability.stats_window import StatsWindow
from officellm.app.percentiles import percentile
from officellm.engine import EngineStats


def stats(prompt: int, generated: int, preemptions: int) -> EngineStats:
    return EngineStats(num_blocks_total=10, num_blocks_used=0, num_blocks_cached=0,
                       kv_cache_usage=0.0, num_running=0, num_waiting=0,
                       num_preemptions_total=preemptions, prefix_cache_queries=0,
                       prefix_cache_hits=0, prompt_tokens_total=prompt,
                       generation_tokens_total=generated)


def test_rates_and_preemption_deltas() -> None:
    w = StatsWindow(window_s=60)
    assert w.add_counters(stats(0, 0, 0), now=100.0) == 0
    assert w.add_counters(stats(600, 120, 2), now=130.0) == 2
    assert w.add_counters(stats(1200, 240, 2), now=160.0) == 0
    rates = w.rates(now=160.0)
    assert rates == {"prompt_tokens_per_s": 20.0, "generation_tokens_per_s": 4.0,
                     "preemptions_per_min": 2.0}
    # Later: the first sample leaves the window; the rate covers what is left.
    w.add_counters(stats(1200, 240, 5), now=200.0)
    assert w.rates(now=200.0)["preemptions_per_min"] == 3 * 60 / 70


def test_latency_percentiles_forget_old_samples() -> None:
    w = StatsWindow(window_s=10)
    for i in range(1, 101):
        w.observe_latency("itl", i / 1000, now=50.0)
    w.observe_latency("ttft", 9.0, now=1.0)
    lat = w.latency(now=55.0)
    # Interpolated between the closest ranks (app.percentiles, as `bench`).
    assert lat["itl_p50"] == pytest.approx(0.0505) and lat["itl_p99"] == pytest.approx(0.09901)
    assert lat["ttft_p50"] is None and lat["e2e_p99"] is None and lat["window_s"] == 10
    assert w.latency(now=61.0)["itl_p50"] is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([], 99) is None


def test_counters_that_start_again_never_give_a_negative_rate() -> None:
    w = StatsWindow(window_s=60)
    w.add_counters(stats(1000, 500, 0), now=100.0)
    w.add_counters(stats(0, 0, 0), now=110.0)  # the model was unloaded and loaded back
    w.add_counters(stats(100, 20, 0), now=120.0)
    assert w.rates(now=120.0)["generation_tokens_per_s"] == 2.0


def test_each_model_has_a_window_of_its_own() -> None:
    windows = ModelWindows(window_s=60)
    windows.of("coder").observe_latency("ttft", 0.5, now=10.0)
    assert windows.of("coder").latency(now=11.0)["ttft_p50"] == 0.5
    assert windows.of("chat").latency(now=11.0)["ttft_p50"] is None
    assert windows.of("coder") is windows.of("coder")
