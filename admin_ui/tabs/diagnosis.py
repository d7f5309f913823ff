"""Diagnosis: docs/design.md §9's symptom table, live: what users would be seeing now, why, and
what to change. The rules are admin_ui.diagnosis; this tab shows their findings, with the
server's recent events (preemptions, policy refusals) below as the evidence trail."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QHeaderView, QLabel, QSplitter, QTableView, QVBoxLayout, QWidget

from officellm.admin_ui.diagnosis import Finding, diagnose
from officellm.admin_ui.history import StatsHistory
from officellm.admin_ui.models.events_model import EventRow, EventsModel
from officellm.admin_ui.models.findings_model import FindingsModel
from officellm.admin_ui.session import AdminSession

EVENTS_REFRESH_MS = 5000
EVENTS_SHOWN = 50


def _view(model, stretch_from: int) -> QTableView:
    view = QTableView()
    view.setModel(model)
    view.setWordWrap(True)
    view.verticalHeader().setVisible(False)
    header = view.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
    for col in range(stretch_from):
        header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
    return view


class DiagnosisTab(QWidget):
    def __init__(self, session: AdminSession | None = None, parent=None) -> None:
        super().__init__(parent)
        self.session = session
        layout = QVBoxLayout(self)
        intro = QLabel(
            "What runs out first is KV-cache memory, not people online: chat apps resend the "
            "whole history every turn, so one colleague on turn 40 weighs more than five on "
            "short chats. The rows below are worked out from the last minute of live numbers.")
        intro.setWordWrap(True)
        layout.addWidget(intro)
        split = QSplitter(Qt.Orientation.Vertical)
        self.model = FindingsModel(self)
        self.view = _view(self.model, 1)
        split.addWidget(self.view)
        events_box = QWidget()
        el = QVBoxLayout(events_box)
        el.setContentsMargins(0, 0, 0, 0)
        el.addWidget(QLabel("Recent events on the server"))
        self.events_model = EventsModel(self)
        self.events_view = _view(self.events_model, 3)
        el.addWidget(self.events_view)
        split.addWidget(events_box)
        split.setSizes([300, 250])
        layout.addWidget(split)
        self.findings: list[Finding] = []
        if session is not None:
            self.timer = QTimer(self)
            self.timer.setInterval(EVENTS_REFRESH_MS)
            self.timer.timeout.connect(self.refresh_events)
            self.timer.start()
            session.changed.connect(self.refresh_events)

    def show_history(self, history: StatsHistory) -> None:
        findings = diagnose(list(history))
        # Only reset the table when the findings change, so a selection survives refreshes.
        if findings != self.findings:
            self.findings = findings
            self.model.set_records(findings)
            self.view.resizeRowsToContents()

    def refresh_events(self) -> None:
        if self.session is not None:
            self.session.call(lambda c: c.events(limit=EVENTS_SHOWN), self._show_events,
                              lambda _exc: None)  # the banner already says when it is down

    def _show_events(self, events: list[dict]) -> None:
        self.events_model.set_records([EventRow.from_json(e) for e in events])
