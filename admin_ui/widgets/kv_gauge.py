"""The KV cache usage gauge: a progress bar that turns amber, then red, as the pool fills."""

from __future__ import annotations

from PySide6.QtWidgets import QProgressBar

# Colours by level: the KV pool is the resource that runs out first (docs/design.md §9).
_LEVELS = [(0.9, "#d9534f"), (0.7, "#f0ad4e"), (0.0, "#5cb85c")]


class KVGauge(QProgressBar):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setRange(0, 1000)
        self.setMinimumHeight(34)
        self.set_usage(0.0, 0, 0)

    def set_usage(self, usage: float, used_blocks: int | None, total_blocks: int | None) -> None:
        """Show `usage` (0-1) of the pool; the block counts, where known, in the label."""
        usage = max(0.0, min(1.0, usage))
        self.setValue(int(usage * 1000))
        blocks = ("" if used_blocks is None or total_blocks is None
                  else f"  ({used_blocks:,} of {total_blocks:,} blocks)")
        self.setFormat(f"KV cache {usage:.1%}{blocks}")
        color = next(c for level, c in _LEVELS if usage >= level)
        self.setStyleSheet(
            "QProgressBar { border: 1px solid #888; border-radius: 4px; text-align: center; "
            "font-weight: bold; } "
            f"QProgressBar::chunk {{ background-color: {color}; }}")
        self.usage = usage
