"""One small KV gauge per generate model in memory, for a server serving several (its
model registry): the model's name, then its pool's use. Hidden while there are fewer than
two, where the dashboard's one big gauge already says it all."""

from __future__ import annotations

from PySide6.QtWidgets import QGridLayout, QGroupBox, QLabel

from officellm.admin_ui.snapshot import ModelStats
from officellm.admin_ui.widgets.kv_gauge import KVGauge

SMALL_GAUGE_HEIGHT = 20  # the main gauge is 34 px: these are its smaller siblings


class ModelGaugesBox(QGroupBox):
    """Rows of (name and state, gauge, running and waiting requests), one per model."""

    def __init__(self, parent=None) -> None:
        super().__init__("KV cache per model", parent)
        self._grid = QGridLayout(self)
        self._rows: list[tuple[QLabel, KVGauge, QLabel]] = []
        self.setVisible(False)

    def set_models(self, models: list[ModelStats]) -> None:
        """Show one gauge per model when there are two or more; hide the box otherwise."""
        shown = models if len(models) >= 2 else []
        while len(self._rows) < len(shown):
            i = len(self._rows)
            name, gauge, detail = QLabel(), KVGauge(), QLabel()
            gauge.setMinimumHeight(SMALL_GAUGE_HEIGHT)
            gauge.setMaximumHeight(SMALL_GAUGE_HEIGHT)
            self._grid.addWidget(name, i, 0)
            self._grid.addWidget(gauge, i, 1)
            self._grid.addWidget(detail, i, 2)
            self._rows.append((name, gauge, detail))
        for i, (name, gauge, detail) in enumerate(self._rows):
            visible = i < len(shown)
            for w in (name, gauge, detail):
                w.setVisible(visible)
            if not visible:
                continue
            m = shown[i]
            name.setText(m.name if m.state == "ready" else f"{m.name} ({m.state})")
            gauge.set_usage(m.kv_cache_usage or 0.0, m.num_blocks_used, m.num_blocks_total)
            detail.setText(f"{m.num_running} running, {m.num_waiting} waiting")
        self.setVisible(bool(shown))

    def rows(self) -> list[tuple[str, str]]:
        """What the box shows: (name, gauge label) per model, for tests."""
        return [(n.text(), g.text()) for n, g, _ in self._rows if n.isVisibleTo(self)]
