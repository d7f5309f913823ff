"""The dashboard's model picker: it lists the served models, starts on the default model, and
the chart, requests, rates and latencies follow the model it is switched to."""

from __future__ import annotations

from typing import Any

import pytest

from officellm.admin_ui.history import StatsHistory
from officellm.admin_ui.snapshot import StatsSnapshot
from officellm.admin_ui.tabs.dashboard import DashboardTab
from tests.admin_ui.samples import stats_json

DEFAULT = "SmolLM2-135M-Instruct.Q4_1"  # stats_json's model


def _model(name: str, usage: float, running: int, gen_tps: float, ttft: float) -> dict[str, Any]:
    return {"name": name, "state": "ready", "kv_cache_usage": usage, "num_blocks_total": 100,
            "num_blocks_used": round(usage * 100), "num_running": running, "num_waiting": 0,
            "rates": {"prompt_tokens_per_s": 0.0, "generation_tokens_per_s": gen_tps,
                      "preemptions_per_min": 0.0},
            "latency": {"ttft_p50": ttft, "ttft_p99": ttft, "itl_p50": None, "itl_p99": None,
                        "e2e_p50": None, "e2e_p99": None, "window_s": 60}}


def _history() -> StatsHistory:
    """Three seconds of a server with two models: the default runs 1, the coder 3."""
    history = StatsHistory()
    for t in (1.0, 2.0, 3.0):
        body = stats_json(usage=0.1, running=1, uptime=t, ttft=(0.2, 0.2))
        body["models"] = [_model(DEFAULT, 0.1, 1, 40.0, 0.2), _model("coder", 0.6, 3, 9.0, 1.5)]
        history.add(StatsSnapshot.from_json(body, received=t))
    return history


@pytest.fixture
def dashboard(qtbot) -> DashboardTab:
    dash = DashboardTab()
    qtbot.addWidget(dash)
    history = _history()
    assert history.latest is not None
    dash.show_snapshot(history.latest, history)
    return dash


def _running_curve(dash: DashboardTab) -> list[float]:
    return list(dash.chart.running_curve.getData()[1])


def test_the_picker_lists_the_served_models_and_starts_on_the_default(
        dashboard: DashboardTab) -> None:
    picker = dashboard.model_picker
    assert [picker.itemText(i) for i in range(picker.count())] == [DEFAULT, "coder"]
    assert dashboard.picked_model == DEFAULT
    assert _running_curve(dashboard) == [1, 1, 1]


def test_switching_the_picker_shows_that_models_numbers(dashboard: DashboardTab) -> None:
    dashboard.model_picker.setCurrentText("coder")
    assert _running_curve(dashboard) == [3, 3, 3]
    assert list(dashboard.chart.kv_curve.getData()[1]) == pytest.approx([60, 60, 60])
    assert dashboard.values["gen_tps"].text() == "9.0 tok/s"
    assert dashboard.values["ttft"].text() == "1,500 ms / 1,500 ms"


def test_the_choice_survives_the_next_snapshot(dashboard: DashboardTab) -> None:
    dashboard.model_picker.setCurrentText("coder")
    history = _history()
    assert history.latest is not None
    dashboard.show_snapshot(history.latest, history)
    assert dashboard.picked_model == "coder" and _running_curve(dashboard) == [3, 3, 3]
