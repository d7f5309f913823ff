"""A KV tier's gauge (docs/kv_tiers.md): how much of its size the blocks below the pool
take, and how many were copied back into the pool instead of computed; hidden when the model
has no such tier. The dashboard shows one for RAM and one for disk."""

from __future__ import annotations

from PySide6.QtWidgets import QProgressBar

from officellm.admin_ui import format as fmt
from officellm.admin_ui.snapshot import TierNumbers


class KVTierGauge(QProgressBar):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setRange(0, 1000)
        self.setMinimumHeight(26)
        self.setStyleSheet(
            "QProgressBar { border: 1px solid #888; border-radius: 4px; text-align: center; } "
            "QProgressBar::chunk { background-color: #5b8bd6; }")
        self.set_tier(None)

    def set_tier(self, tier: TierNumbers | None) -> None:
        """Show the tier (hidden for None)."""
        self.setVisible(tier is not None)
        if tier is None:
            return
        self.setValue(int(min(1.0, tier.usage) * 1000))
        self.setFormat(f"KV {tier.where} {fmt.size_of(tier.bytes_used, tier.capacity_bytes)}  "
                       f"({tier.blocks:,} blocks)  · {tier.blocks_read:,} blocks copied back"
                       + (f"  · {tier.note}" if tier.note else ""))
