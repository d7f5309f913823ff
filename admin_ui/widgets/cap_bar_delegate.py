"""Draw a thread's length against its user's cap as a progress bar inside the table cell."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, Qt
from PySide6.QtGui import QColor, QPainter, QPalette
from PySide6.QtWidgets import (
    QApplication,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionProgressBar,
    QStyleOptionViewItem,
)

from officellm.admin_ui.models.record_table import RECORD_ROLE

# Green while there is room, amber near the cap, red at or over it (the next turn is refused,
# notified or truncated, by the user's policy).
_LEVELS = [(1.0, "#d9534f"), (0.8, "#f0ad4e"), (0.0, "#4cae4c")]


def level_color(fraction: float) -> str:
    return next(color for level, color in _LEVELS if fraction >= level)


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
        bar.textAlignment = Qt.AlignmentFlag.AlignCenter
        # Qt 6 reads the orientation from the state flag; without it the bar is drawn
        # vertically, as a sliver at the cell's bottom.
        bar.state = QStyle.StateFlag.State_Enabled | QStyle.StateFlag.State_Horizontal
        palette = QPalette(option.palette)
        palette.setColor(QPalette.ColorRole.Highlight, QColor(level_color(frac)))
        # Dark text on every level: the style's white-on-highlight is unreadable on amber.
        palette.setColor(QPalette.ColorRole.HighlightedText, QColor("#1b1b1b"))
        palette.setColor(QPalette.ColorRole.Text, QColor("#1b1b1b"))
        bar.palette = palette
        style = option.widget.style() if option.widget else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ProgressBar, bar, painter)
