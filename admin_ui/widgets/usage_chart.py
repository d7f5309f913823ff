"""The Usage tab's chart: each row's prompt and completion tokens as one stacked bar (a day's,
a person's or a model's), named under it. pyqtgraph draws; this only feeds it."""

from __future__ import annotations

import pyqtgraph as pg

from officellm.admin_ui.usage_report import UsageRow

PROMPT_COLOR = "#0275d8"
COMPLETION_COLOR = "#f0ad4e"
# Under this many bars every one is named on the axis; above it, evenly spaced ones.
MAX_NAMED_BARS = 16


class UsageChart(pg.PlotWidget):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setBackground("w")
        self.setMinimumHeight(220)
        plot = self.getPlotItem()
        plot.showGrid(x=False, y=True, alpha=0.3)
        plot.setMouseEnabled(x=False, y=False)
        plot.hideButtons()
        plot.setLabel("left", "tokens")
        plot.getAxis("left").setWidth(56)
        self.legend = plot.addLegend(offset=(-8, 4), labelTextColor="#333")
        self.prompt_bars = pg.BarGraphItem(x=[], height=[], width=0.7,
                                           brush=PROMPT_COLOR, pen=None, name="prompt")
        self.completion_bars = pg.BarGraphItem(x=[], y0=[], height=[], width=0.7,
                                               brush=COMPLETION_COLOR, pen=None,
                                               name="completion")
        plot.addItem(self.prompt_bars)
        plot.addItem(self.completion_bars)
        self.names: list[str] = []

    def show_rows(self, rows: list[UsageRow]) -> None:
        """One stacked bar per row, in the rows' order."""
        self.names = [r.name for r in rows]
        xs = list(range(len(rows)))
        prompt = [r.prompt_tokens for r in rows]
        self.prompt_bars.setOpts(x=xs, height=prompt)
        self.completion_bars.setOpts(x=xs, y0=prompt, height=[r.completion_tokens for r in rows])
        step = max(1, -(-len(rows) // MAX_NAMED_BARS))
        self.getPlotItem().getAxis("bottom").setTicks(
            [[(i, self.names[i]) for i in range(0, len(rows), step)]])
        top = max([r.total_tokens for r in rows], default=0)
        self.getPlotItem().setXRange(-0.6, max(len(rows), 1) - 0.4, padding=0)
        self.getPlotItem().setYRange(0, max(top, 10) * 1.08, padding=0)
