"""Diagnosis: DESIGN §9's symptom table, live: what users would be seeing now, why, and
what to change. The rules are admin_ui.diagnosis; this tab only shows their findings, with
the recent warning events from the server below."""

from __future__ import annotations

from PySide6.QtWidgets import QHeaderView, QLabel, QTableView, QVBoxLayout, QWidget

from admin_ui.diagnosis import Finding, diagnose
from admin_ui.history import StatsHistory
from admin_ui.models.findings_model import FindingsModel


class DiagnosisTab(QWidget):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        intro = QLabel(
            "What runs out first is KV-cache memory, not people online: chat apps resend the "
            "whole history every turn, so one colleague on turn 40 weighs more than five on "
            "short chats. The rows below are worked out from the last minute of live numbers.")
        intro.setWordWrap(True)
        layout.addWidget(intro)
        self.model = FindingsModel(self)
        self.view = QTableView()
        self.view.setModel(self.model)
        self.view.setWordWrap(True)
        self.view.verticalHeader().setVisible(False)
        header = self.view.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        layout.addWidget(self.view)
        self.findings: list[Finding] = []

    def show_history(self, history: StatsHistory) -> None:
        findings = diagnose(list(history))
        # Only reset the table when the findings change, so a selection survives refreshes.
        if findings != self.findings:
            self.findings = findings
            self.model.set_records(findings)
            self.view.resizeRowsToContents()
