"""The live chart of the last minutes: KV cache usage (%) with running and waiting requests.

pyqtgraph does the drawing; this class only keeps the curves fed from the history.
"""

from __future__ import annotations

import pyqtgraph as pg

from admin_ui.history import StatsHistory


class LiveChart(pg.PlotWidget):
    def __init__(self, parent=None, span_s: float = 300.0) -> None:
        super().__init__(parent, background="w")
        self.span_s = span_s
        self.setMinimumHeight(220)
        self.showGrid(x=True, y=True, alpha=0.3)
        self.setLabel("bottom", "seconds ago")
        self.setLabel("left", "KV usage % / requests")
        self.addLegend(offset=(10, 10))
        self.setXRange(-span_s, 0, padding=0)
        self.setYRange(0, 100, padding=0.02)
        self.enableAutoRange(axis="y", enable=False)
        self.setMouseEnabled(x=False, y=False)
        self.kv_curve = self.plot([], [], name="KV cache %",
                                  pen=pg.mkPen("#d9534f", width=2),
                                  fillLevel=0, brush=pg.mkBrush(217, 83, 79, 40))
        self.running_curve = self.plot([], [], name="running", pen=pg.mkPen("#0275d8", width=2))
        self.waiting_curve = self.plot([], [], name="waiting",
                                       pen=pg.mkPen("#f0ad4e", width=2, style=pg.QtCore.Qt.DashLine))

    def update_from(self, history: StatsHistory) -> None:
        snaps = history.within(self.span_s)
        if not snaps:
            for c in (self.kv_curve, self.running_curve, self.waiting_curve):
                c.setData([], [])
            return
        now = snaps[-1].received
        xs = [s.received - now for s in snaps]
        kv = [s.engine.kv_cache_usage * 100 for s in snaps]
        running = [s.engine.num_running for s in snaps]
        waiting = [s.engine.num_waiting for s in snaps]
        self.kv_curve.setData(xs, kv)
        self.running_curve.setData(xs, running)
        self.waiting_curve.setData(xs, waiting)
        top = max(100.0, max(running + waiting) * 1.1)
        self.setYRange(0, top, padding=0.02)
