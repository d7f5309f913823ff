"""Threads: every active conversation per user, its length against the user's cap,
sortable, heaviest first (docs/design.md §9: long chats, not people online, fill the cache)."""

from __future__ import annotations

from PySide6.QtCore import QRegularExpression, QSortFilterProxyModel, Qt
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from officellm.admin_ui.models.record_table import SORT_ROLE
from officellm.admin_ui.models.threads_model import CAP_COLUMN, ThreadsModel
from officellm.admin_ui.snapshot import StatsSnapshot
from officellm.admin_ui.widgets.cap_bar_delegate import CapBarDelegate

ALL_USERS = "All users"
LENGTH_COLUMN = 2


class ThreadsTab(QWidget):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        top = QHBoxLayout()
        top.addWidget(QLabel("Show:"))
        self.user_filter = QComboBox()
        self.user_filter.addItem(ALL_USERS)
        self.user_filter.currentTextChanged.connect(self._apply_filter)
        top.addWidget(self.user_filter)
        top.addStretch(1)
        self.summary = QLabel("")
        top.addWidget(self.summary)
        layout.addLayout(top)

        self.model = ThreadsModel(self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SORT_ROLE)
        self.proxy.setFilterKeyColumn(0)
        self.view = QTableView()
        self.view.setModel(self.proxy)
        self.view.setSortingEnabled(True)
        self.view.setItemDelegateForColumn(CAP_COLUMN, CapBarDelegate(self.view))
        self.view.setSelectionBehavior(QTableView.SelectionBehavior.SelectRows)
        self.view.verticalHeader().setVisible(False)
        header = self.view.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(CAP_COLUMN, QHeaderView.ResizeMode.Stretch)
        # Heaviest first until the admin clicks another header.
        self.view.sortByColumn(LENGTH_COLUMN, Qt.SortOrder.DescendingOrder)
        layout.addWidget(self.view)

    def show_snapshot(self, snap: StatsSnapshot) -> None:
        threads = snap.active_threads
        self.model.set_records(threads)
        users = sorted({t.user for t in threads})
        known = {self.user_filter.itemText(i) for i in range(self.user_filter.count())}
        for u in users:
            if u not in known:
                self.user_filter.addItem(u)
        total = sum(t.length for t in threads)
        self.summary.setText(f"{len(threads)} active thread(s) from {len(users)} user(s), "
                             f"{total:,} tokens in all")

    def _apply_filter(self, text: str) -> None:
        if text == ALL_USERS:
            self.proxy.setFilterFixedString("")
        else:
            self.proxy.setFilterRegularExpression(f"^{QRegularExpression.escape(text)}$")

