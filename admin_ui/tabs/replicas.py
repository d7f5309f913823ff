"""Replicas: the servers sharing this one's database (docs/cluster.md), each one's KV pool and
work; and, for the view picked (all of them summed, or one), its pool and each person's hold
on it, with the replica they are on. A single server is one row."""

from __future__ import annotations

from PySide6.QtCore import QSortFilterProxyModel, Qt
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from officellm.admin_ui.models.people_model import PeopleModel
from officellm.admin_ui.models.record_table import SORT_ROLE, RecordTableModel
from officellm.admin_ui.models.replicas_model import ReplicasModel
from officellm.admin_ui.replicas import ALL, ReplicaRow, people, survey, totals
from officellm.admin_ui.session import AdminSession


def _table(model: RecordTableModel, sort_column: int | None = None) -> QTableView:
    proxy = QSortFilterProxyModel(model)
    proxy.setSourceModel(model)
    proxy.setSortRole(SORT_ROLE)
    view = QTableView()
    view.setModel(proxy)
    view.setSortingEnabled(True)
    if sort_column is not None:
        view.sortByColumn(sort_column, Qt.SortOrder.DescendingOrder)
    view.verticalHeader().setVisible(False)
    view.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    return view


class ReplicasTab(QWidget):
    def __init__(self, session: AdminSession, parent=None) -> None:
        super().__init__(parent)
        self.session = session
        self._asking = False
        self._rows: list[ReplicaRow] = []
        layout = QVBoxLayout(self)
        self.model = ReplicasModel(self)
        self.view = _table(self.model)
        layout.addWidget(self.view)
        picked = QHBoxLayout()
        picked.addWidget(QLabel("View:"))
        self.picker = QComboBox()
        self.picker.addItem("All", ALL)
        self.picker.currentIndexChanged.connect(self._show_view)
        picked.addWidget(self.picker)
        self.summary = QLabel("")
        picked.addWidget(self.summary, 1)
        layout.addLayout(picked)
        self.people = PeopleModel(self)
        self.people_view = _table(self.people, sort_column=2)  # the heaviest holder first
        layout.addWidget(self.people_view)
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
        self._rows = rows
        self.model.set_records(rows)
        names = [self.picker.itemData(i) for i in range(1, self.picker.count())]
        if names != [r.name for r in rows]:
            picked = self.picker.currentData()
            self.picker.blockSignals(True)
            while self.picker.count() > 1:
                self.picker.removeItem(1)
            for r in rows:
                self.picker.addItem(r.name, r.name)
            at = self.picker.findData(picked)
            self.picker.setCurrentIndex(max(at, 0))  # a replica gone from the list: All
            self.picker.blockSignals(False)
        self._show_view()

    def _show_view(self) -> None:
        replica = self.picker.currentData()
        t = totals(self._rows, replica)
        where = (f"All: {t.replicas} live replica(s) of {len(self._rows)}" if replica is ALL
                 else f"{replica}: {'live' if t.replicas else 'not answering'}")
        self.summary.setText(
            f"{where}; KV cache {t.blocks_used:,} / {t.blocks_total:,} blocks "
            f"({t.kv_usage:.0%}), {t.running} running, {t.waiting} waiting")
        self.people.set_records(people(self._rows, replica))

    def _failed(self, exc: Exception) -> None:
        self._asking = False
        self.error.setText(f"Could not list the replicas: {exc}")
