"""A QAbstractTableModel over a list of plain records, described by its columns.

Each concrete model (threads, users, keys, findings) is then only its column list. Sorting
goes through a QSortFilterProxyModel reading SORT_ROLE, so numbers sort as numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt

T = TypeVar("T")

SORT_ROLE = Qt.ItemDataRole.UserRole + 1
RECORD_ROLE = Qt.ItemDataRole.UserRole + 2
ModelIndex = QModelIndex | QPersistentModelIndex


@dataclass
class Column(Generic[T]):
    header: str
    text: Callable[[T], str]
    sort_key: Callable[[T], Any] | None = None  # default: the text
    numeric: bool = False  # right-aligned
    tooltip: Callable[[T], str] | None = None


class RecordTableModel(QAbstractTableModel, Generic[T]):
    """Rows are records of type T; `set_records` replaces them all (the console refreshes
    whole lists from the server, which are small: an office's users and threads)."""

    columns: Sequence[Column] = ()

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._records: list[T] = []

    def set_records(self, records: Sequence[T]) -> None:
        self.beginResetModel()
        self._records = list(records)
        self.endResetModel()

    def records(self) -> list[T]:
        return list(self._records)

    def record(self, row: int) -> T:
        return self._records[row]

    def rowCount(self, parent: ModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._records)

    def columnCount(self, parent: ModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.columns)

    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return self.columns[section].header
        return None

    def data(self, index: ModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        rec = self._records[index.row()]
        col = self.columns[index.column()]
        if role == Qt.ItemDataRole.DisplayRole:
            return col.text(rec)
        if role == SORT_ROLE:
            return col.sort_key(rec) if col.sort_key else col.text(rec)
        if role == RECORD_ROLE:
            return rec
        if role == Qt.ItemDataRole.TextAlignmentRole and col.numeric:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ToolTipRole and col.tooltip:
            return col.tooltip(rec)
        return None
