"""The Diagnosis table: one row per live finding of admin_ui.diagnosis."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor

from officellm.admin_ui.diagnosis import INFO, OK, WARNING, Finding
from officellm.admin_ui.models.record_table import Column, ModelIndex, RecordTableModel

_COLORS = {WARNING: QColor("#f8d7a9"), INFO: QColor("#fff3bf"), OK: QColor("#d3f0d8")}
_LABELS = {WARNING: "⚠ warning", INFO: "ℹ note", OK: "✓ ok"}


class FindingsModel(RecordTableModel[Finding]):
    columns = [
        Column("", lambda f: _LABELS.get(f.severity, f.severity)),
        Column("What users see", lambda f: f.symptom),
        Column("Likely cause", lambda f: f.cause),
        Column("What to do", lambda f: f.advice),
        Column("Evidence", lambda f: "; ".join(f.evidence)),
    ]

    def data(self, index: ModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if index.isValid() and role == Qt.ItemDataRole.BackgroundRole:
            return _COLORS.get(self.record(index.row()).severity)
        return super().data(index, role)
