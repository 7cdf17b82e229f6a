"""The dashboard's plots: a metric's lines against step, a 2-D path, one bar per replica.

Each is a ``BudgetedPlot`` (``tpudash.tui.plotwidget``: built off the UI
thread, redrawn only when its data change) with one ``replot()``. A plot's
lines share a budget of about two points per column (the histories
themselves are bounded: ``tpudash.runs.series``), so a redraw costs the
same after a million points as after a thousand. Legends and the y label
are ``tpudash.tui.plotlegend``'s, ticks ``tpudash.tui.plotticks``'. A metric
plot also marks the steps where the run's step function was compiled again
(``set_marks``: vertical lines, listed in the legend as "recompile").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from tpudash.runs.series import DecimatedSeries, decimate_min_max, decimate_stride
from tpudash.tui.plotlegend import DecoratedFigure, Decoration, LegendEntry, decorate, legend_corner, legend_entry
from tpudash.tui.plotticks import MIN_TICK_STEP, TICK_DIGITS, format_tick, nice_ticks
from tpudash.tui.plotwidget import BudgetedPlot, RenderKey, build_rows, plots_drawn

__all__ = [  # the plots', and what screens, benchmarks and tests import from here
    "MIN_TICK_STEP",
    "POINT_BUDGET_PER_COLUMN",
    "TICK_DIGITS",
    "BudgetedPlot",
    "DecoratedFigure",
    "Decoration",
    "LegendEntry",
    "MetricPlot",
    "PathPlot",
    "PlotLine",
    "RenderKey",
    "ReplicaBarPlot",
    "build_rows",
    "decorate",
    "format_tick",
    "legend_corner",
    "legend_entry",
    "nice_ticks",
    "plots_drawn",
    "share_points",
]

# Points all lines of a plot draw together, per character column.
POINT_BUDGET_PER_COLUMN = 2.0
RECOMPILE_COLOR = "orange"
RECOMPILE_LABEL = "recompile"


@dataclass
class PlotLine:
    """One line (or scatter) of a plot, read from a bounded series; listed in the legend under its label."""

    label: str | None
    """None: a line the legend leaves out."""
    series: DecimatedSeries
    color: str | None = None
    scatter: bool = False
    """Dots instead of a line: for noisy raw values (cheap to draw, spikes still show)."""
    markers: bool = False
    """Also mark each point (per-epoch values: few, and each one matters)."""


class MetricPlot(BudgetedPlot):
    """Lines of one metric against step: e.g. train per batch (smoothed), per epoch, val."""

    def __init__(
        self,
        title: str,
        *,
        xlabel: str = "step",
        log_y: bool = False,
        y_range: tuple[float, float] | None = None,
        id: str | None = None,
        classes: str | None = None,
    ):
        super().__init__(id=id, classes=classes)
        self.title = title
        self.xlabel = xlabel
        self.log_y = log_y
        self.y_range = y_range
        """Fixed y limits (percentages: 0 to 100), or None to follow the data."""
        self.lines: list[PlotLine] = []
        self.drawn_series: dict[str, tuple[list[float], list[float]]] = {}
        """What the last replot handed to plotext, per line label (decimated)."""
        self.marks: tuple[int, ...] = ()
        """Steps where the run recompiled, drawn as vertical lines (``tpudash.tui.advicetab``)."""
        self.drawn_marks: tuple[float, ...] = ()
        """The marks the last replot drew (those within the steps the lines cover)."""

    def set_lines(self, lines: Sequence[PlotLine]) -> None:
        self.lines = list(lines)
        self.redraw()

    def set_marks(self, steps: Sequence[int]) -> None:
        """Mark ``steps`` (recompiles) on the step axis; redrawn only when they change."""
        marks = tuple(steps)
        if marks != self.marks:
            self.marks = marks
            self.redraw()

    def replot(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.title(self.title)
        plt.xlabel(self.xlabel)
        drawn = 0
        all_positive = True
        self.drawn_series = {}
        plotted = [(line, *line.series.points()) for line in self.lines]
        plotted = [(line, xs, ys) for line, xs, ys in plotted if xs]
        self.drawn_marks = ()
        allotments = share_points(self.point_budget, [len(xs) for _, xs, _ in plotted])
        for index, ((line, xs, ys), allotment) in enumerate(zip(plotted, allotments)):
            all_positive = all_positive and min(ys) > 0
            if line.scatter:
                # Dots, not a line: a line through noisy min/max points zigzags
                # the full height at every step, and plotext draws every pixel
                # of every segment (a hundred milliseconds for one noisy line).
                xs, ys = decimate_min_max(xs, ys, max(allotment // 2, 1))
                plt.scatter(xs, ys, color=line.color, marker="braille")
            else:
                # Lines carry smoothed or per-epoch values: evenly spaced points
                # follow them; min/max pairs would only add zigzags.
                xs, ys = decimate_stride(xs, ys, allotment)
                plt.plot(xs, ys, color=line.color, marker="braille")
            if line.label:  # the line's own marker and colour, before the epochs' dots below
                self.add_to_legend(line.label)
            if not line.scatter and line.markers and len(xs) <= self.columns // 4:
                plt.scatter(xs, ys, color=line.color, marker="●")
            self.drawn_series[line.label or f"line {index}"] = (xs, ys)  # an unlabelled line: not in the legend
            drawn += len(xs)
        log_scale = bool(self.log_y and drawn and all_positive)
        plt.yscale("log" if log_scale else "linear")
        if self.y_range is not None:
            plt.ylim(*self.y_range)
        if drawn:
            self._set_ticks(log_scale)
            self._draw_marks()
        if not drawn:
            plt.title(f"{self.title} (waiting for data)")
        self.points_drawn = drawn

    def _draw_marks(self) -> None:
        """A vertical line at each recompile within the steps the lines cover (beyond them it would stretch the axis)."""
        xs = [x for line_xs, _ in self.drawn_series.values() for x in line_xs]
        low, high = min(xs), max(xs)
        self.drawn_marks = tuple(float(step) for step in self.marks if low <= step <= high)
        for step in self.drawn_marks:
            self.plt.vline(step, color=RECOMPILE_COLOR)
        if self.drawn_marks:
            entry = LegendEntry(RECOMPILE_LABEL, RECOMPILE_COLOR, "default", "│")
            self.decoration = replace(self.decoration, legend=(*self.decoration.legend, entry))

    def _set_ticks(self, log_scale: bool) -> None:
        """Even ticks that cover every drawn point, the axes' limits set to them."""
        xs = [x for line_xs, _ in self.drawn_series.values() for x in line_xs]
        ys = [y for _, line_ys in self.drawn_series.values() for y in line_ys]
        # Steps and seconds: an axis of one point at step 30 reads 0 … 30, never 29.5.
        self.set_even_ticks(xs, None if log_scale else ys, y_range=self.y_range, x_min_step=1.0)

    @property
    def point_budget(self) -> int:
        """Points all lines may draw together: plotext's cost grows with them, not with history."""
        return int(POINT_BUDGET_PER_COLUMN * self.columns)


def share_points(budget: int, lengths: Sequence[int]) -> list[int]:
    """Split ``budget`` points among lines: short lines get all theirs, long ones share the rest."""
    allotments = [0] * len(lengths)
    remaining, left = budget, len(lengths)
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        allotments[index] = min(lengths[index], max(remaining // left, 2))
        remaining -= allotments[index]
        left -= 1
    return allotments


class PathPlot(BudgetedPlot):
    """A 2-D path, such as gradient descent's (x0, x1) from start to minimum."""

    def __init__(
        self,
        title: str,
        *,
        xlabel: str = "x0",
        ylabel: str = "x1",
        id: str | None = None,
        classes: str | None = None,
    ):
        super().__init__(id=id, classes=classes)
        self.title = title
        self.xlabel = xlabel
        self.ylabel = ylabel
        self.path = DecimatedSeries()
        self.markers: dict[str, tuple[float, float]] = {}
        """Where the last replot put the "start" and "end" markers."""

    def set_path(self, path: DecimatedSeries) -> None:
        self.path = path
        self.redraw()

    def replot(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.title(self.title)
        plt.xlabel(self.xlabel)
        self.decoration = Decoration(y_label=self.ylabel)  # above the y axis (plotext's sits under the x axis)
        xs, ys = decimate_stride(*self.path.points(), self.columns)
        self.markers = {"start": (xs[0], ys[0]), "end": (xs[-1], ys[-1])} if xs else {}
        if xs:
            plt.plot(xs, ys, marker="braille")
            self.add_to_legend("path")
            plt.scatter([xs[0]], [ys[0]], marker="o", color="green")
            self.add_to_legend("start")
            plt.scatter([xs[-1]], [ys[-1]], marker="x", color="red")
            self.add_to_legend("end")
            self.set_even_ticks(xs, ys)
        else:
            plt.title(f"{self.title} (waiting for data)")
        self.points_drawn = len(xs)


class ReplicaBarPlot(BudgetedPlot):
    """One bar per replica or device, such as matmul GFLOP/s per device."""

    def __init__(self, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.title = ""
        self.labels: list[str] = []
        self.values: list[float] = []

    def set_values(self, title: str, labels: Sequence[str], values: Sequence[float]) -> None:
        self.title = title
        self.labels = [str(label) for label in labels]
        self.values = [float(value) for value in values]
        self.redraw()

    def replot(self) -> None:
        plt = self.plt
        plt.clear_data()
        if self.values:
            plt.bar(self.labels, self.values, marker="hd")
            plt.title(self.title)
            # Bars stand on 0: the value axis runs from 0 (or the lowest value, below 0) to the highest.
            self.set_even_ticks(None, [min(0.0, *self.values), max(0.0, *self.values)])
        else:
            plt.title("per-replica values (waiting for data)")
        self.points_drawn = len(self.values)
