"""Replicas: the servers sharing this one's database (docs/cluster.md), each one's KV pool and
work, and all of them summed. A single server is one row."""

from __future__ import annotations

from PySide6.QtCore import QSortFilterProxyModel
from PySide6.QtWidgets import QHeaderView, QLabel, QTableView, QVBoxLayout, QWidget

from officellm.admin_ui.models.record_table import SORT_ROLE
from officellm.admin_ui.models.replicas_model import ReplicasModel
from officellm.admin_ui.replicas import ReplicaRow, survey, totals
from officellm.admin_ui.session import AdminSession


class ReplicasTab(QWidget):
    def __init__(self, session: AdminSession, parent=None) -> None:
        super().__init__(parent)
        self.session = session
        self._asking = False
        layout = QVBoxLayout(self)
        self.summary = QLabel("")
        layout.addWidget(self.summary)
        self.model = ReplicasModel(self)
        proxy = QSortFilterProxyModel(self)
        proxy.setSourceModel(self.model)
        proxy.setSortRole(SORT_ROLE)
        self.view = QTableView()
        self.view.setModel(proxy)
        self.view.setSortingEnabled(True)
        self.view.verticalHeader().setVisible(False)
        self.view.horizontalHeader().setSectionResizeMode(
            QHeaderView.ResizeMode.ResizeToContents)
        layout.addWidget(self.view)
        self.error = QLabel("")
        layout.addWidget(self.error)

    def refresh(self) -> None:
        """Ask again (one survey at a time: a slow replica must not pile up requests)."""
        if self._asking:
            return
        self._asking = self.session.call(survey, self.show_rows, self._failed) is not None

    def show_rows(self, rows: list[ReplicaRow]) -> None:
        self._asking = False
        self.error.setText("")
        self.model.set_records(rows)
        t = totals(rows)
        self.summary.setText(
            f"All: {t.replicas} live replica(s) of {len(rows)}; KV cache {t.blocks_used:,} / "
            f"{t.blocks_total:,} blocks ({t.kv_usage:.0%}), {t.running} running, "
            f"{t.waiting} waiting")

    def _failed(self, exc: Exception) -> None:
        self._asking = False
        self.error.setText(f"Could not list the replicas: {exc}")
