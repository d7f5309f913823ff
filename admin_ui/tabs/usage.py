"""Usage: who used how much of which model, over a range of UTC days (GET /admin/usage),
by user, by model or by day: a stacked bar chart of prompt and completion tokens above the
table of every counter, and the range's total. Asked when shown, when the range or grouping
changes, and on Refresh; never any message content."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

from PySide6.QtCore import QDate, QSortFilterProxyModel, Qt
from PySide6.QtWidgets import (
    QComboBox,
    QDateEdit,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from officellm.admin_ui.admin_client import AdminError
from officellm.admin_ui.models.record_table import SORT_ROLE
from officellm.admin_ui.models.usage_model import UsageModel
from officellm.admin_ui.session import AdminSession
from officellm.admin_ui.usage_report import BY_CHOICES, UsageReport
from officellm.admin_ui.widgets.usage_chart import UsageChart

DEFAULT_DAYS = 30  # the range shown first: the last 30 UTC days, today included
NOT_CONNECTED = "Not connected: start the local server or connect to one by URL."


def _utc_today() -> date:
    return datetime.now(timezone.utc).date()


def _date_edit(day: date) -> QDateEdit:
    edit = QDateEdit(QDate(day.year, day.month, day.day))
    edit.setCalendarPopup(True)
    edit.setDisplayFormat("yyyy-MM-dd")
    return edit


class UsageTab(QWidget):
    def __init__(self, session: AdminSession, parent=None) -> None:
        super().__init__(parent)
        self.session = session
        self.report: UsageReport | None = None
        self._generation = 0  # bumped by every new question: older answers are dropped
        layout = QVBoxLayout(self)

        top = QHBoxLayout()
        today = _utc_today()
        self.since = _date_edit(today - timedelta(days=DEFAULT_DAYS - 1))
        self.until = _date_edit(today)
        self.by = QComboBox()
        self.by.addItems(BY_CHOICES)
        self.refresh_button = QPushButton("Refresh")
        for label, widget in (("From", self.since), ("to", self.until), ("by", self.by)):
            top.addWidget(QLabel(label))
            top.addWidget(widget)
        top.addWidget(self.refresh_button)
        top.addStretch(1)
        self.summary = QLabel("")
        top.addWidget(self.summary)
        layout.addLayout(top)
        self.message = QLabel(NOT_CONNECTED)
        self.message.setWordWrap(True)
        layout.addWidget(self.message)

        self.chart = UsageChart()
        layout.addWidget(self.chart, stretch=2)
        self.model = UsageModel(self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SORT_ROLE)
        self.view = QTableView()
        self.view.setModel(self.proxy)
        self.view.setSortingEnabled(True)
        # The server's order until the admin clicks a header: days in order, people and
        # models largest first.
        self.view.horizontalHeader().setSortIndicator(-1, Qt.SortOrder.AscendingOrder)
        self.view.verticalHeader().setVisible(False)
        self.view.horizontalHeader().setSectionResizeMode(
            QHeaderView.ResizeMode.ResizeToContents)
        layout.addWidget(self.view, stretch=3)

        self.since.dateChanged.connect(self.refresh)
        self.until.dateChanged.connect(self.refresh)
        self.by.currentTextChanged.connect(self.refresh)
        self.refresh_button.clicked.connect(self.refresh)
        session.changed.connect(self._target_changed)

    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        self.refresh()

    def _target_changed(self) -> None:
        self.show_report(None)
        if self.isVisible():
            self.refresh()

    def question(self) -> dict[str, str]:
        """GET /admin/usage's parameters as the controls stand."""
        return {"since": self.since.date().toString("yyyy-MM-dd"),
                "until": self.until.date().toString("yyyy-MM-dd"),
                "by": self.by.currentText()}

    def refresh(self) -> None:
        """Ask for the report on a worker thread; a later question supersedes it."""
        self._generation += 1
        gen, question = self._generation, self.question()
        task = self.session.call(lambda c: c.usage(**question),
                                 lambda body: self._answered(gen, body),
                                 lambda exc: self._failed(gen, exc))
        self.message.setText(NOT_CONNECTED if task is None else "")

    def _answered(self, gen: int, body: dict) -> None:
        if gen == self._generation:
            self.show_report(UsageReport.from_json(body))

    def _failed(self, gen: int, exc: Exception) -> None:
        if gen != self._generation:
            return
        if isinstance(exc, AdminError) and exc.status == 404:
            self.show_report(None)
            self.message.setText("This server has no usage report (it is older than the "
                                 "console): update it to see usage here.")
        else:
            self.message.setText(f"Cannot read /admin/usage: {exc}")

    def show_report(self, report: UsageReport | None) -> None:
        """Put a report (None: none) in the chart, the table and the summary line."""
        self.report = report
        rows = report.rows if report is not None else []
        self.model.set_by(report.by if report is not None else self.by.currentText())
        self.model.set_records(rows)
        self.chart.show_rows(rows)
        if report is None:
            self.summary.setText("")
            return
        t = report.total
        self.message.setText("")
        self.summary.setText(f"{report.since} to {report.until}: {t.requests:,} requests, "
                             f"{t.total_tokens:,} tokens ({t.cached_tokens:,} cached), "
                             f"{t.busy_seconds:,.0f} s busy")
