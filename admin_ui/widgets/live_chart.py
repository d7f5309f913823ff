"""The live chart of the last minutes: KV cache usage (%) above, running and waiting requests
below, on one time axis, of one model (the default unless the dashboard's picker chose
another). Two plots rather than one with two scales: a 0-100 % curve would flatten a count
of 3 requests into the floor.

pyqtgraph does the drawing; this class only keeps the curves fed from the history.
"""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt

from officellm.admin_ui.history import StatsHistory


class LiveChart(pg.GraphicsLayoutWidget):
    def __init__(self, parent=None, span_s: float = 300.0) -> None:
        super().__init__(parent)
        self.setBackground("w")
        self.span_s = span_s
        self.setMinimumHeight(260)
        self.kv_plot = self.addPlot(row=0, col=0)
        self.req_plot = self.addPlot(row=1, col=0)
        self.ci.layout.setRowStretchFactor(0, 3)
        self.ci.layout.setRowStretchFactor(1, 2)
        for plot in (self.kv_plot, self.req_plot):
            plot.showGrid(x=True, y=True, alpha=0.3)
            plot.setXRange(-span_s, 0, padding=0)
            plot.setMouseEnabled(x=False, y=False)
            plot.hideButtons()
            plot.getAxis("left").setWidth(48)
        self.req_plot.setXLink(self.kv_plot)
        self.kv_plot.setLabel("left", "KV cache %")
        self.kv_plot.setYRange(0, 100, padding=0.02)
        self.kv_plot.getAxis("bottom").setStyle(showValues=False)
        self.req_plot.setLabel("left", "requests")
        self.req_plot.setLabel("bottom", "seconds ago")
        self.req_plot.addLegend(offset=(8, 4))
        self.kv_curve = self.kv_plot.plot([], [], pen=pg.mkPen("#d9534f", width=2),
                                          fillLevel=0, brush=pg.mkBrush(217, 83, 79, 50))
        self.running_curve = self.req_plot.plot([], [], name="running",
                                                pen=pg.mkPen("#0275d8", width=2))
        self.waiting_curve = self.req_plot.plot(
            [], [], name="waiting", pen=pg.mkPen("#f0ad4e", width=2, style=Qt.PenStyle.DashLine))

    def update_from(self, history: StatsHistory, model: str | None = None) -> None:
        """Draw `model`'s last minutes (None: the default model's) from `history`."""
        snaps = history.within(self.span_s)
        points = [(s.received, n) for s in snaps
                  if (n := s.numbers_of(model)) is not None]
        if not points:
            for c in (self.kv_curve, self.running_curve, self.waiting_curve):
                c.setData([], [])
            return
        now = snaps[-1].received
        xs = [t - now for t, _ in points]
        running = [n.num_running for _, n in points]
        waiting = [n.num_waiting for _, n in points]
        self.kv_curve.setData(xs, [n.kv_cache_usage * 100 for _, n in points])
        self.running_curve.setData(xs, running)
        self.waiting_curve.setData(xs, waiting)
        self.req_plot.setYRange(0, max(4, max(running + waiting) + 1), padding=0.02)
