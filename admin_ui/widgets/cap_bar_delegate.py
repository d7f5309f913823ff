"""Draw a thread's length against its user's cap as a progress bar inside the table cell."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import (
    QApplication,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionProgressBar,
    QStyleOptionViewItem,
)

from admin_ui.models.record_table import RECORD_ROLE


class CapBarDelegate(QStyledItemDelegate):
    """Uses the style's own progress bar, so it looks native on every platform; a thread with
    no cap is drawn as plain text."""

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        thread = index.data(RECORD_ROLE)
        frac = getattr(thread, "fraction_of_cap", None)
        if frac is None:
            super().paint(painter, option, index)
            return
        bar = QStyleOptionProgressBar()
        bar.rect = option.rect.adjusted(2, 3, -2, -3)
        bar.minimum = 0
        bar.maximum = 1000
        bar.progress = int(min(frac, 1.0) * 1000)
        bar.text = str(index.data(Qt.ItemDataRole.DisplayRole))
        bar.textVisible = True
        bar.state = option.state | QStyle.StateFlag.State_Enabled
        style = option.widget.style() if option.widget else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ProgressBar, bar, painter)
