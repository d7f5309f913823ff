"""Dashboard: KV cache gauge (the RAM and disk tiers' below it, where the model has them; one
small gauge per model when several are in memory), who
holds the cache (a bar per user), live chart, preemptions, prefix-cache hits, throughput and
latency percentiles, refreshed from every stats snapshot."""

from __future__ import annotations

from PySide6.QtWidgets import QFormLayout, QGridLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

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
        self.chart = LiveChart()
        layout.addWidget(self.chart, stretch=1)

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

    def show_snapshot(self, snap: StatsSnapshot, history: StatsHistory) -> None:
        e, r, lat = snap.engine, snap.rates, snap.latency
        self.model_label.setText(
            f"{snap.model or 'model'} — up {fmt.duration(snap.uptime_s)}" + snap.state_note)
        self.gauge.set_usage(e.kv_cache_usage, e.num_blocks_used, e.num_blocks_total)
        self.host_gauge.set_tier(e.kv_host)
        self.disk_gauge.set_tier(e.kv_disk)
        self.model_gauges.set_models(snap.models)
        self.shares.set_users(snap.users)
        v = self.values
        v["running"].setText(str(e.num_running))
        v["waiting"].setText(str(e.num_waiting))
        v["preemptions"].setText(f"{e.num_preemptions_total:,}")
        v["preemptions_min"].setText(f"{r.preemptions_per_min:,.1f}")
        v["structured"].setText(fmt.kind_counts(snap.structured_requests))
        v["prompt_tps"].setText(fmt.rate(r.prompt_tokens_per_s, "tok/s"))
        v["gen_tps"].setText(fmt.rate(r.generation_tokens_per_s, "tok/s"))
        v["prefix_hit"].setText(fmt.pct(e.prefix_hit_rate))
        v["drafts"].setText("—" if e.draft_acceptance is None else
                            f"{fmt.pct(e.draft_acceptance)} of "
                            f"{e.spec_decode_num_draft_tokens:,}")
        v["blocks"].setText(f"{e.num_blocks_used:,} used, {e.num_blocks_cached:,} cached, "
                            f"{e.num_blocks_total:,} total")
        v["ttft"].setText(f"{fmt.ms(lat.ttft_p50)} / {fmt.ms(lat.ttft_p99)}")
        v["itl"].setText(f"{fmt.ms(lat.itl_p50)} / {fmt.ms(lat.itl_p99)}")
        v["e2e"].setText(f"{fmt.ms(lat.e2e_p50)} / {fmt.ms(lat.e2e_p99)}")
        v["window"].setText(f"last {lat.window_s:.0f} s")
        self.chart.update_from(history)
