"""Who holds the KV cache right now: one bar per user, the heaviest first (and what of theirs
the KV disk tier keeps)."""

from __future__ import annotations

from PySide6.QtWidgets import QGridLayout, QGroupBox, QLabel, QProgressBar

from officellm.admin_ui import format as fmt
from officellm.admin_ui.snapshot import UserShare

MAX_ROWS = 8  # the heaviest holders; the rest are summed on one line


class UserSharesBox(QGroupBox):
    """Rows of (name, bar of the pool they hold, running requests and preemptions)."""

    def __init__(self, parent=None) -> None:
        super().__init__("Who holds the KV cache", parent)
        self._grid = QGridLayout(self)
        self._rows: list[tuple[QLabel, QProgressBar, QLabel]] = []
        self.empty = QLabel("Nobody: no request holds the cache.")
        self._grid.addWidget(self.empty, 0, 0, 1, 3)

    def set_users(self, users: list[UserShare]) -> None:
        holders = [u for u in users if u.kv_blocks > 0]
        shown = holders[:MAX_ROWS]
        rest = holders[MAX_ROWS:]
        if rest:
            shown.append(UserShare(f"{len(rest)} others", sum(u.kv_blocks for u in rest),
                                   sum(u.kv_share for u in rest), sum(u.running for u in rest),
                                   sum(u.preemptions_total for u in rest),
                                   sum(u.kv_disk_bytes for u in rest)))
        while len(self._rows) < len(shown):
            i = len(self._rows)
            name, bar, detail = QLabel(), QProgressBar(), QLabel()
            bar.setRange(0, 1000)
            bar.setMaximumHeight(18)
            self._grid.addWidget(name, i + 1, 0)
            self._grid.addWidget(bar, i + 1, 1)
            self._grid.addWidget(detail, i + 1, 2)
            self._rows.append((name, bar, detail))
        for i, (name, bar, detail) in enumerate(self._rows):
            visible = i < len(shown)
            for w in (name, bar, detail):
                w.setVisible(visible)
            if not visible:
                continue
            u = shown[i]
            name.setText(u.user)
            bar.setValue(int(max(0.0, min(1.0, u.kv_share)) * 1000))
            bar.setFormat(f"{u.kv_share:.0%}")
            detail.setText(f"{u.running} running, {u.kv_blocks:,} blocks, "
                           f"{u.preemptions_total:,} preempted"
                           + (f", {fmt.size(u.kv_disk_bytes)} on disk" if u.kv_disk_bytes
                              else ""))
        self.empty.setVisible(not shown)

    def rows(self) -> list[tuple[str, int, str]]:
        """What the box shows: (user, bar value 0-1000, detail), for tests."""
        return [(n.text(), b.value(), d.text()) for n, b, d in self._rows if n.isVisibleTo(self)]
