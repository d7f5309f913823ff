"""Capacity: the plan arithmetic for the loaded model (docs/design.md §4) — bytes per token, pool
tokens, and how many threads of today's average length and of the cap fit — plus a what-if
for another memory size using engine.kv_plan."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from admin_ui import format as fmt
from admin_ui.admin_client import AdminError
from admin_ui.capacity import Capacity, capacity_from_plan, capacity_from_stats, what_if
from admin_ui.session import AdminSession
from admin_ui.snapshot import StatsSnapshot
from admin_ui.workers import run_async

REFRESH_EVERY = 5  # snapshots between /admin/plan fetches: the pool does not change often


class CapacityTab(QWidget):
    def __init__(self, session: AdminSession, parent=None) -> None:
        super().__init__(parent)
        self.session = session
        self.capacity: Capacity | None = None
        self._count = 0
        self._plan_missing = False
        layout = QVBoxLayout(self)
        box = QGroupBox("The loaded model")
        form = QFormLayout(box)
        self.values: dict[str, QLabel] = {}
        for key, label in [
            ("model", "Model"), ("bpt", "KV cache per token"), ("pool", "KV pool"),
            ("mml", "Max model length"), ("avg", "Today's average thread"),
            ("at_avg", "Threads of that length that fit"), ("cap", "Per-thread cap (default)"),
            ("at_cap", "Threads at the cap that fit"), ("at_mml", "Threads at max length"),
        ]:
            value = QLabel("—")
            value.setStyleSheet("font-weight: bold;")
            self.values[key] = value
            form.addRow(label, value)
        layout.addWidget(box)

        what = QGroupBox("What if… (officellm plan)")
        wl = QVBoxLayout(what)
        row = QHBoxLayout()
        self.wi_model = QLineEdit()
        self.wi_model.setPlaceholderText("model dir, .gguf or shipped name, e.g. Qwen2.5-7B-Instruct")
        self.wi_memory = QLineEdit("80GiB")
        self.wi_button = QPushButton("Plan")
        self.wi_button.clicked.connect(self.run_what_if)
        row.addWidget(self.wi_model, stretch=3)
        row.addWidget(self.wi_memory, stretch=1)
        row.addWidget(self.wi_button)
        wl.addLayout(row)
        self.wi_output = QPlainTextEdit()
        self.wi_output.setReadOnly(True)
        self.wi_output.setMaximumHeight(160)
        wl.addWidget(self.wi_output)
        layout.addWidget(what)
        layout.addStretch(1)
        session.changed.connect(self._reset)

    def _reset(self) -> None:
        self._count = 0
        self._plan_missing = False

    def show_snapshot(self, snap: StatsSnapshot) -> None:
        """Ask the server for its plan every few snapshots; until it answers (or on a server
        without /admin/plan) derive the numbers from the stats."""
        if self._count % REFRESH_EVERY == 0 and not self._plan_missing:
            self.session.call(lambda c: c.plan(), self._show_plan, self._plan_failed)
        self._count += 1
        if self._plan_missing or self.capacity is None:
            caps = [t.cap for t in snap.active_threads if t.cap]
            self.show_capacity(capacity_from_stats(snap.model, snap.engine, snap.active_threads,
                                                   min(caps) if caps else None))

    def _show_plan(self, plan: dict) -> None:
        self.show_capacity(capacity_from_plan(plan))

    def _plan_failed(self, exc: Exception) -> None:
        if isinstance(exc, AdminError) and exc.status == 404:
            self._plan_missing = True

    def show_capacity(self, c: Capacity) -> None:
        self.capacity = c
        v = self.values
        v["model"].setText(c.model or "—")
        v["bpt"].setText(f"{c.bytes_per_token:,} B/token")
        v["pool"].setText(f"{c.kv_cache_tokens:,} tokens ({c.num_blocks:,} blocks of "
                          f"{c.block_size}; {fmt.size(c.pool_bytes)})")
        v["mml"].setText(f"{c.max_model_len:,} tokens")
        v["avg"].setText(f"{c.avg_thread_tokens:,} tokens" if c.avg_thread_tokens else
                         "no threads yet today")
        v["at_avg"].setText(f"{c.threads_at_avg:,.2f}x" if c.avg_thread_tokens else "—")
        v["cap"].setText(f"{c.cap:,} tokens" if c.cap else "no cap")
        v["at_cap"].setText(f"{c.threads_at_cap:,.2f}x" if c.threads_at_cap is not None else "—")
        v["at_mml"].setText(f"{c.threads_at_max_len:,.2f}x")

    def run_what_if(self) -> None:
        model, memory = self.wi_model.text().strip(), self.wi_memory.text().strip()
        if not model:
            self.wi_output.setPlainText("Name a model first.")
            return
        self.wi_output.setPlainText("Working it out…")
        avg = self.capacity.avg_thread_tokens if self.capacity and \
            self.capacity.avg_thread_tokens else 4000

        def work() -> str:
            from engine.kv_plan import format_plan

            return format_plan(what_if(model, memory, avg_tokens=avg))

        run_async(work, self.wi_output.setPlainText,
                  lambda exc: self.wi_output.setPlainText(f"Cannot plan: {exc}"))
