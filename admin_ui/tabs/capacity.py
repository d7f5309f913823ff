"""Capacity: the server's `GET /admin/plan` for the loaded model (docs/design.md §4) — bytes per
token, pool tokens, and how many threads of today's average length, of the cap and of the max
model length fit — shown as the server answers it, plus a what-if for another model or
memory size that the server works out too (`POST /admin/plan`)."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import (
    QComboBox,
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

from officellm.admin_ui import format as fmt
from officellm.admin_ui.admin_client import AdminError
from officellm.admin_ui.capacity import Plan, WhatIf
from officellm.admin_ui.session import AdminSession

# /admin/plan is asked for when the tab is shown, when the console switches server, and
# every PLAN_REFRESH_MS while the tab is on screen (today's average thread moves slowly).
PLAN_REFRESH_MS = 5000
# The what-if's KV cache dtypes (a subset of the server's --kv-cache-dtype; written out here
# because the console imports nothing of the server's).
WHAT_IF_KV_DTYPES = ("auto", "float16", "bfloat16", "fp8_e4m3", "int8")
NOT_CONNECTED = "Not connected: start the local server or connect to one by URL."
WHAT_IF_NOT_CONNECTED = "Not connected: the server works the plan out, so connect to one first."

ROWS = [
    ("model", "Model"), ("bpt", "KV cache per token"), ("pool", "KV pool"),
    ("mml", "Max model length"), ("avg", "Today's average thread"),
    ("at_avg", "Threads of that length that fit"), ("cap", "Per-thread cap (default)"),
    ("at_cap", "Threads at the cap that fit"), ("at_mml", "Threads at max length"),
]


def _tokens(n: int | None) -> str:
    return "—" if n is None else f"{n:,} tokens"


def _times(x: float | None) -> str:
    return "—" if x is None else f"{x:,.2f}x"


def plan_texts(p: Plan) -> dict[str, str]:
    """The text of each row for one /admin/plan answer (formatting only, no arithmetic)."""
    pool = _tokens(p.kv_cache_tokens)
    details = []
    if p.num_blocks is not None and p.block_size is not None:
        details.append(f"{p.num_blocks:,} blocks of {p.block_size}")
    if p.kv_cache_bytes is not None:
        details.append(fmt.size(p.kv_cache_bytes))
    if details and p.kv_cache_tokens is not None:
        pool += f" ({'; '.join(details)})"
    return {
        "model": p.model or "—",
        "bpt": "—" if p.bytes_per_token is None else
               f"{p.bytes_per_token:,} B/token" + (f" ({p.kv_cache_dtype})" if p.kv_cache_dtype else ""),
        "pool": pool,
        "mml": _tokens(p.max_model_len),
        "avg": _tokens(p.avg_thread_tokens) if p.avg_thread_tokens else "no threads yet today",
        "at_avg": _times(p.threads_at_avg),
        "cap": _tokens(p.cap) if p.cap else "no cap",
        "at_cap": _times(p.threads_at_cap),
        "at_mml": _times(p.threads_at_max_len),
    }


class CapacityTab(QWidget):
    def __init__(self, session: AdminSession, parent=None) -> None:
        super().__init__(parent)
        self.session = session
        self.plan: Plan | None = None
        self._generation = 0  # bumped when the server changes: older answers are dropped
        self._in_flight = False
        layout = QVBoxLayout(self)
        box = QGroupBox("The loaded model (the server's /admin/plan)")
        form = QFormLayout(box)
        self.values: dict[str, QLabel] = {}
        for key, label in ROWS:
            value = QLabel("—")
            value.setStyleSheet("font-weight: bold;")
            self.values[key] = value
            form.addRow(label, value)
        layout.addWidget(box)
        self.message = QLabel(NOT_CONNECTED)
        self.message.setWordWrap(True)
        layout.addWidget(self.message)

        what = QGroupBox("What if… (officellm plan)")
        wl = QVBoxLayout(what)
        row = QHBoxLayout()
        self.wi_model = QLineEdit()
        self.wi_model.setPlaceholderText("model dir, .gguf or shipped name, e.g. Qwen2.5-7B-Instruct")
        self.wi_memory = QLineEdit("80GiB")
        # What the KV cache would be stored in (--kv-cache-dtype): fp8 fits twice the chats.
        self.wi_kv_dtype = QComboBox()
        self.wi_kv_dtype.addItems(WHAT_IF_KV_DTYPES)
        self.wi_button = QPushButton("Plan")
        self.wi_button.clicked.connect(self.run_what_if)
        row.addWidget(self.wi_model, stretch=3)
        row.addWidget(self.wi_memory, stretch=1)
        row.addWidget(self.wi_kv_dtype)
        row.addWidget(self.wi_button)
        wl.addLayout(row)
        self.wi_output = QPlainTextEdit()
        self.wi_output.setReadOnly(True)
        self.wi_output.setMaximumHeight(160)
        wl.addWidget(self.wi_output)
        layout.addWidget(what)
        layout.addStretch(1)

        self.timer = QTimer(self)
        self.timer.setInterval(PLAN_REFRESH_MS)
        self.timer.timeout.connect(self._tick)
        self.timer.start()
        session.changed.connect(self._target_changed)

    # --- reading /admin/plan ---------------------------------------------------------------
    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        self.refresh()

    def _tick(self) -> None:
        if self.isVisible():  # nobody reads a hidden tab: it asks again when shown
            self.refresh()

    def _target_changed(self) -> None:
        self._generation += 1
        self._in_flight = False
        self._clear()
        self.wi_output.clear()  # that server's what-if answer (or its "Working it out…")
        self.message.setText(NOT_CONNECTED if not self.session.connected else "Asking the server…")
        if self.isVisible():
            self.refresh()

    def refresh(self) -> None:
        """Ask for /admin/plan on a worker thread (one request at a time)."""
        if self._in_flight:
            return
        gen = self._generation
        task = self.session.call(lambda c: c.plan(), lambda plan: self._answered(gen, plan),
                                 lambda exc: self._failed(gen, exc))
        self._in_flight = task is not None
        if task is None:
            self.message.setText(NOT_CONNECTED)

    def _answered(self, gen: int, plan: dict) -> None:
        if gen != self._generation:
            return
        self._in_flight = False
        self.show_plan(Plan.from_json(plan))

    def _failed(self, gen: int, exc: Exception) -> None:
        if gen != self._generation:
            return
        self._in_flight = False
        status = exc.status if isinstance(exc, AdminError) else None
        if status == 404:
            self._clear()
            self.message.setText("This server has no /admin/plan (it is older than the "
                                 "console): update it to see its capacity here.")
        elif status == 503:
            self._clear()
            self.message.setText(f"No plan yet: {exc}")
        else:
            self.message.setText(f"Cannot read /admin/plan: {exc}"
                                 + (" (numbers shown are the last answer)" if self.plan else ""))

    def _clear(self) -> None:
        self.plan = None
        for label in self.values.values():
            label.setText("—")

    def show_plan(self, plan: Plan) -> None:
        self.plan = plan
        for key, text in plan_texts(plan).items():
            self.values[key].setText(text)
        self.message.setText("")

    # --- what if -----------------------------------------------------------------------------
    def run_what_if(self) -> None:
        """Ask the server's `POST /admin/plan` on a worker thread; its report goes in the box."""
        model, memory = self.wi_model.text().strip(), self.wi_memory.text().strip()
        kv_dtype = self.wi_kv_dtype.currentText()
        if not model:
            self.wi_output.setPlainText("Name a model first.")
            return
        avg = self.plan.avg_thread_tokens if self.plan and self.plan.avg_thread_tokens else 4000
        question = WhatIf(model=model, memory=memory, kv_cache_dtype=kv_dtype, avg_tokens=avg)
        gen = self._generation  # a path names a file on that server: drop another's answer
        task = self.session.call(lambda c: c.what_if_plan(question.to_json()),
                                 lambda answer: self._what_if_says(gen, answer["text"]),
                                 lambda exc: self._what_if_says(gen, f"Cannot plan: {exc}"))
        self.wi_output.setPlainText("Working it out…" if task is not None
                                    else WHAT_IF_NOT_CONNECTED)

    def _what_if_says(self, gen: int, text: str) -> None:
        if gen == self._generation:
            self.wi_output.setPlainText(text)
