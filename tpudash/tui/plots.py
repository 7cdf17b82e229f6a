"""The dashboard's plots: textual-plotext widgets that redraw within a CPU budget.

Each plot subclasses ``PlotextPlot``, draws with its own ``self.plt`` and has
one ``replot()`` that turns the current data into a figure. A plot's lines
share a budget of about two points per column (the histories themselves are
bounded: ``tpudash.runs.series``), so a redraw costs the same after a million
points as after a thousand. Redraws share a ``RedrawBudget``: plotext renders
in pure Python, and a dashboard that steals a core from training would cost
its user the very throughput they are watching.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from textual_plotext import PlotextPlot

from tpudash.runs.series import DecimatedSeries, decimate_min_max, decimate_stride

# Points all lines of a plot draw together, per character column.
POINT_BUDGET_PER_COLUMN = 2.0


class RedrawBudget:
    """Keeps plot rendering under a fraction of one core.

    ``record`` adds the cost of a render; ``ready`` says whether plots may be
    redrawn now: not before ``min_interval`` since the last round (≤ 10 Hz) and
    not before the time spent rendering has been paid back at ``fraction``,
    but never more than ``max_interval`` later. A 20 ms render at the default
    1.5 % waits about 1.3 s before the next one.
    """

    def __init__(
        self,
        fraction: float = 0.015,
        min_interval: float = 0.1,
        max_interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.fraction = fraction
        self.min_interval = min_interval
        self.max_interval = max_interval
        self._clock = clock
        self._next_allowed = 0.0
        self._last_round = -math.inf
        self.rendered_seconds = 0.0
        self.renders = 0

    def ready(self) -> bool:
        now = self._clock()
        return now >= self._next_allowed and now - self._last_round >= self.min_interval

    def start_round(self) -> None:
        self._last_round = self._clock()

    def record(self, seconds: float) -> None:
        self.rendered_seconds += seconds
        self.renders += 1
        now = self._clock()
        # On a starved machine renders get slow; plots still move every max_interval.
        self._next_allowed = min(max(self._next_allowed, now) + seconds / self.fraction, now + self.max_interval)


# -- plots ----------------------------------------------------------------------


@dataclass
class PlotLine:
    """One labelled line (or scatter) of a plot, read from a bounded series."""

    label: str
    series: DecimatedSeries
    color: str | None = None
    scatter: bool = False
    """Dots instead of a line: for noisy raw values (cheap to draw, spikes still show)."""
    markers: bool = False
    """Also mark each point (per-epoch values: few, and each one matters)."""


class BudgetedPlot(PlotextPlot):
    """A PlotextPlot that reports what each render costs and redraws on resize."""

    DEFAULT_CSS = """
    BudgetedPlot {
        width: 1fr;
        height: 1fr;
        min-height: 8;
    }
    """

    MIN_WIDTH = 16
    MIN_HEIGHT = 5

    def __init__(
        self,
        budget: RedrawBudget | None = None,
        *,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ):
        super().__init__(name=name, id=id, classes=classes)
        self.budget = budget
        self.last_render_seconds = 0.0
        self.points_drawn = 0
        """How many points the last ``replot`` handed to plotext (all lines)."""
        self._drawn_width = -1

    def render(self):
        if self.size.width < self.MIN_WIDTH or self.size.height < self.MIN_HEIGHT:
            return ""
        started = time.perf_counter()
        if self.size.width != self._drawn_width:
            # Decimation depends on the width, which may have changed since replot().
            self._replot_at_width()
        result = super().render()
        self.last_render_seconds = time.perf_counter() - started
        if self.budget is not None:
            self.budget.record(self.last_render_seconds)
        return result

    def on_resize(self) -> None:
        self.redraw()

    @property
    def columns(self) -> int:
        """Points worth drawing across: about one per character column."""
        return max(self.size.width - 10, 20)

    def redraw(self) -> None:
        """Replot the current data and schedule a repaint."""
        self._replot_at_width()
        self.refresh()

    def _replot_at_width(self) -> None:
        self._drawn_width = self.size.width
        self.replot()

    def replot(self) -> None:
        """Clear ``self.plt`` and plot the current data, decimated to the current width."""
        raise NotImplementedError


class MetricPlot(BudgetedPlot):
    """Lines of one metric against step: e.g. train per batch (smoothed), per epoch, val."""

    def __init__(
        self,
        title: str,
        budget: RedrawBudget | None = None,
        *,
        xlabel: str = "step",
        log_y: bool = False,
        y_range: tuple[float, float] | None = None,
        id: str | None = None,
        classes: str | None = None,
    ):
        super().__init__(budget, id=id, classes=classes)
        self.title = title
        self.xlabel = xlabel
        self.log_y = log_y
        self.y_range = y_range
        """Fixed y limits (percentages: 0 to 100), or None to follow the data."""
        self.lines: list[PlotLine] = []
        self.drawn_series: dict[str, tuple[list[float], list[float]]] = {}
        """What the last replot handed to plotext, per line label (decimated)."""

    def set_lines(self, lines: Sequence[PlotLine]) -> None:
        self.lines = list(lines)
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
        allotments = share_points(self.point_budget, [len(xs) for _, xs, _ in plotted])
        for (line, xs, ys), allotment in zip(plotted, allotments):
            all_positive = all_positive and min(ys) > 0
            if line.scatter:
                # Dots, not a line: a line through noisy min/max points zigzags
                # the full height at every step, and plotext draws every pixel
                # of every segment (a hundred milliseconds for one noisy line).
                xs, ys = decimate_min_max(xs, ys, max(allotment // 2, 1))
                plt.scatter(xs, ys, label=line.label, color=line.color, marker="braille")
            else:
                # Lines carry smoothed or per-epoch values: evenly spaced points
                # follow them; min/max pairs would only add zigzags.
                xs, ys = decimate_stride(xs, ys, allotment)
                plt.plot(xs, ys, label=line.label, color=line.color, marker="braille")
                if line.markers and len(xs) <= self.columns // 4:
                    plt.scatter(xs, ys, color=line.color, marker="●")
            self.drawn_series[line.label] = (xs, ys)
            drawn += len(xs)
        if self.log_y and drawn and all_positive:
            plt.yscale("log")
        else:
            plt.yscale("linear")
        if self.y_range is not None:
            plt.ylim(*self.y_range)
        if not drawn:
            plt.title(f"{self.title} (waiting for data)")
        self.points_drawn = drawn

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
        budget: RedrawBudget | None = None,
        *,
        xlabel: str = "x0",
        ylabel: str = "x1",
        id: str | None = None,
        classes: str | None = None,
    ):
        super().__init__(budget, id=id, classes=classes)
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
        plt.ylabel(self.ylabel)
        xs, ys = decimate_stride(*self.path.points(), self.columns)
        self.markers = {"start": (xs[0], ys[0]), "end": (xs[-1], ys[-1])} if xs else {}
        if xs:
            plt.plot(xs, ys, marker="braille", label="path")
            plt.scatter([xs[0]], [ys[0]], marker="o", label="start", color="green")
            plt.scatter([xs[-1]], [ys[-1]], marker="x", label="end", color="red")
        else:
            plt.title(f"{self.title} (waiting for data)")
        self.points_drawn = len(xs)


class ReplicaBarPlot(BudgetedPlot):
    """One bar per replica or device, such as matmul GFLOP/s per device."""

    def __init__(self, budget: RedrawBudget | None = None, *, id: str | None = None, classes: str | None = None):
        super().__init__(budget, id=id, classes=classes)
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
        else:
            plt.title("per-replica values (waiting for data)")
        self.points_drawn = len(self.values)
