"""The KV disk tier's gauge: how much of its budget the blocks on disk take, and how many prompt
tokens were read back from it instead of computed; hidden when the model has no disk tier."""

from __future__ import annotations

from PySide6.QtWidgets import QProgressBar

from officellm.admin_ui import format as fmt
from officellm.admin_ui.snapshot import DiskTierNumbers


class DiskTierGauge(QProgressBar):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setRange(0, 1000)
        self.setMinimumHeight(26)
        self.setStyleSheet(
            "QProgressBar { border: 1px solid #888; border-radius: 4px; text-align: center; } "
            "QProgressBar::chunk { background-color: #5b8bd6; }")
        self.set_tier(None, 0)

    def set_tier(self, tier: DiskTierNumbers | None, tokens_read: int) -> None:
        """Show the tier (hidden for None) and the prompt tokens read from it."""
        self.setVisible(tier is not None)
        if tier is None:
            return
        self.setValue(int(min(1.0, tier.usage) * 1000))
        note = "" if tier.writable else "  · writing off (see the server log)"
        self.setFormat(f"KV on disk {fmt.size_of(tier.bytes_used, tier.capacity_bytes)}  "
                       f"({tier.files:,} blocks)  · {tokens_read:,} prompt tokens read back"
                       + note)
