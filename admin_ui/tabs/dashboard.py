"""Dashboard: KV cache gauge (the RAM and disk tiers' below it, where the model has them; one
small gauge per model when several are in memory), who
holds the cache (a bar per user), live chart, preemptions, prefix-cache hits, throughput and
latency percentiles, refreshed from every stats snapshot.

A model picker lists the served models: the chart, the running and waiting counts, the rates
and the latency percentiles are the chosen model's (the default model's until another is
chosen); the gauges, the users' shares and the engine's totals are the default model's."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QVBoxLayout,
    QWidget,
)

from officellm.admin_ui import format as fmt
from officellm.admin_ui.history import StatsHistory
from officellm.admin_ui.snapshot import StatsSnapshot
from officellm.admin_ui.widgets.kv_gauge import KVGauge
from officellm.admin_ui.widgets.kv_tier_gauge import KVTierGauge
from officellm.admin_ui.widgets.live_chart import LiveChart
from officellm.admin_ui.widgets.model_gauges import ModelGaugesBox
from officellm.admin_ui.widgets.user_shares import UserSharesBox


class DashboardTab(QWidget):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        self.model_label = QLabel("No server yet.")
        self.model_label.setStyleSheet("font-size: 14px; font-weight: bold;")
        layout.addWidget(self.model_label)
        self.gauge = KVGauge()
        layout.addWidget(self.gauge)
        # Each hidden unless the model has that tier.
        self.host_gauge, self.disk_gauge = KVTierGauge(), KVTierGauge()
        layout.addWidget(self.host_gauge)
        layout.addWidget(self.disk_gauge)
        self.model_gauges = ModelGaugesBox()  # hidden unless 2+ models are in memory
        layout.addWidget(self.model_gauges)
        self.shares = UserSharesBox()
        layout.addWidget(self.shares)
        picker_row = QHBoxLayout()
        picker_row.addWidget(QLabel("Model"))
        self.model_picker = QComboBox()
        self.model_picker.setToolTip("Whose chart, requests, rates and latencies to show.")
        self.model_picker.setMinimumContentsLength(16)
        self.model_picker.currentTextChanged.connect(lambda _: self._show_picked())
        picker_row.addWidget(self.model_picker)
        picker_row.addStretch(1)
        layout.addLayout(picker_row)
        self.chart = LiveChart()
        layout.addWidget(self.chart, stretch=1)
        self._snap: StatsSnapshot | None = None
        self._history: StatsHistory | None = None

        grid = QGridLayout()
        self.values: dict[str, QLabel] = {}
        groups = {
            "Requests": [("running", "Running"), ("waiting", "Waiting"),
                         ("preemptions", "Preemptions (total)"),
                         ("preemptions_min", "Preemptions per minute"),
                         ("structured", "Structured / tool calls")],
            "Throughput": [("prompt_tps", "Prompt tokens/s"), ("gen_tps", "Generation tokens/s"),
                           ("prefix_hit", "Prefix-cache hit rate"), ("blocks", "KV blocks"),
                           ("drafts", "Draft tokens kept (speculation)")],
            "Latency": [("ttft", "Time to first token p50 / p99"),
                        ("itl", "Inter-token latency p50 / p99"),
                        ("e2e", "End to end p50 / p99"), ("window", "Window")],
        }
        for col, (title, rows) in enumerate(groups.items()):
            box = QGroupBox(title)
            form = QFormLayout(box)
            for key, label in rows:
                value = QLabel("—")
                value.setStyleSheet("font-weight: bold;")
                self.values[key] = value
                form.addRow(label, value)
            grid.addWidget(box, 0, col)
        layout.addLayout(grid)

    @property
    def picked_model(self) -> str | None:
        """The model the picker shows (None before the first snapshot: the default)."""
        return self.model_picker.currentText() or None

    def show_snapshot(self, snap: StatsSnapshot, history: StatsHistory) -> None:
        e = snap.engine
        self._snap, self._history = snap, history
        self._set_picker_models(snap)
        self.model_label.setText(
            f"{snap.model or 'model'} — up {fmt.duration(snap.uptime_s)}" + snap.state_note)
        self.gauge.set_usage(e.kv_cache_usage, e.num_blocks_used, e.num_blocks_total)
        self.host_gauge.set_tier(e.kv_host)
        self.disk_gauge.set_tier(e.kv_disk)
        self.model_gauges.set_models(snap.models)
        self.shares.set_users(snap.users)
        v = self.values
        v["preemptions"].setText(f"{e.num_preemptions_total:,}")
        v["structured"].setText(fmt.kind_counts(snap.structured_requests))
        v["prefix_hit"].setText(fmt.pct(e.prefix_hit_rate))
        v["drafts"].setText("—" if e.draft_acceptance is None else
                            f"{fmt.pct(e.draft_acceptance)} of "
                            f"{e.spec_decode_num_draft_tokens:,}")
        v["blocks"].setText(f"{e.num_blocks_used:,} used, {e.num_blocks_cached:,} cached, "
                            f"{e.num_blocks_total:,} total")
        self._show_picked()

    def _set_picker_models(self, snap: StatsSnapshot) -> None:
        """List the served models (an older server's answer: its one model), keeping the
        choice while that model is served; otherwise the default model."""
        names = [m.name for m in snap.models] or ([snap.model] if snap.model else [])
        if snap.model and snap.model not in names:
            names.insert(0, snap.model)
        items = [self.model_picker.itemText(i) for i in range(self.model_picker.count())]
        if names == items:
            return
        picked = self.model_picker.currentText()
        self.model_picker.blockSignals(True)
        try:
            self.model_picker.clear()
            self.model_picker.addItems(names)
            self.model_picker.setCurrentText(picked if picked in names else snap.model)
        finally:
            self.model_picker.blockSignals(False)

    def _show_picked(self) -> None:
        """The chosen model's chart, requests, rates and latencies."""
        if self._snap is None or self._history is None:
            return
        v = self.values
        numbers = self._snap.numbers_of(self.picked_model)
        if numbers is None:  # not listed in this snapshot: nothing to say
            for key in ("running", "waiting", "preemptions_min", "prompt_tps", "gen_tps",
                        "ttft", "itl", "e2e", "window"):
                v[key].setText("—")
        else:
            r, lat = numbers.rates, numbers.latency
            v["running"].setText(str(numbers.num_running))
            v["waiting"].setText(str(numbers.num_waiting))
            v["preemptions_min"].setText(f"{r.preemptions_per_min:,.1f}")
            v["prompt_tps"].setText(fmt.rate(r.prompt_tokens_per_s, "tok/s"))
            v["gen_tps"].setText(fmt.rate(r.generation_tokens_per_s, "tok/s"))
            v["ttft"].setText(f"{fmt.ms(lat.ttft_p50)} / {fmt.ms(lat.ttft_p99)}")
            v["itl"].setText(f"{fmt.ms(lat.itl_p50)} / {fmt.ms(lat.itl_p99)}")
            v["e2e"].setText(f"{fmt.ms(lat.e2e_p50)} / {fmt.ms(lat.e2e_p99)}")
            v["window"].setText(f"last {lat.window_s:.0f} s")
        self.chart.update_from(self._history, self.picked_model)
