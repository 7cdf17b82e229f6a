"""The dashboard's plots: textual-plotext widgets built off the UI thread, redrawn only when their data change.

Each plot subclasses ``PlotextPlot`` and has one ``replot()`` that turns the
current data into a figure (``self.plt``, a fresh plotext figure each time).
A plot's lines share a budget of about two points per column (the histories
themselves are bounded: ``tpudash.runs.series``), so a redraw costs the same
after a million points as after a thousand. plotext then builds the figure's
text in pure Python (about 10 ms at 160×24, far more on a loaded machine):
that happens in a thread, one build per plot at a time, and the result is
swapped in on the UI thread, so keys never wait for a plot. A plot is built
again only when its data, its size or the theme changed (the run view
redraws on its display beat): a dashboard that steals a core from training
would cost its user the very throughput they are watching.

A plot's legend and its y axis' label are drawn on the built figure
(``Decoration``): the legend in the corner of the canvas that hides the
fewest data (none, as a rule: a falling loss keeps its legend top right,
a rising accuracy top left), and wherever it must overlap, the data shows
through it; the y label sits above the y axis, where one reads it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from plotext._dict import hd_symbols
from plotext._figure import _figure_class
from rich.console import Console
from rich.text import Text
from textual.content import Content
from textual.dom import DOMNode
from textual_plotext import PlotextPlot
from textual_plotext.plot import Plot

from tpudash.runs.series import DecimatedSeries, decimate_min_max, decimate_stride

# Points all lines of a plot draw together, per character column.
POINT_BUDGET_PER_COLUMN = 2.0


# -- plots ----------------------------------------------------------------------


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


@dataclass(frozen=True)
class RenderKey:
    """What a plot's text depends on: its data (counted by replots), its size and its plotext theme."""

    data_version: int
    width: int
    height: int
    theme: str


@dataclass(frozen=True)
class LegendEntry:
    """One line's row of a legend: its marker drawn twice in its colour, then its label."""

    label: str
    color: str
    style: str
    marker: str


@dataclass(frozen=True)
class Decoration:
    """What is drawn on a built figure rather than by plotext: the legend, and the y axis' label above that axis.

    plotext puts a legend in the canvas' top left corner, over whatever data is there (a loss
    curve's first steps), and a y label in the bottom left corner, under the x axis.
    """

    legend: tuple[LegendEntry, ...] = ()
    y_label: str = ""


def build_text(figure: Plot, key: RenderKey, console: Console) -> Content:
    """plotext's build of ``figure`` at ``key``'s size and theme, as Textual content: runs in a worker thread.

    Only ``figure`` is written, and nothing else holds it: every replot draws on a fresh figure.
    """
    figure.plotsize(key.width, key.height)
    figure._set_size(key.width, key.height)  # as PlotextPlot.render does: plotsize alone leaves resizes wrong
    figure.theme(key.theme)
    return Content.from_rich_text(Text.from_ansi(figure.build()), console=console)


class DecoratedFigure(Plot):
    """A plotext figure that draws its ``decoration`` on the matrix plotext built, before its text is made."""

    decoration = Decoration()

    def _build_matrix(self) -> None:
        figure: Any = self  # plotext's internals: typed neither by plotext nor by textual-plotext
        _figure_class._build_matrix(figure)
        decorate(figure.monitor, self.decoration)


def decorate(monitor, decoration: Decoration) -> None:
    """Draw ``decoration`` on plotext's built matrix (``monitor.matrix``: row 0 is the bottom row)."""
    matrix = monitor.matrix
    text_colors = (monitor.ticks_color, monitor.ticks_style)
    if decoration.y_label and matrix.rows:
        # The top row, at the left: above the y axis' tick labels (the title is centred on the canvas).
        matrix.add_horizontal_string(0, matrix.rows - 1, decoration.y_label, *text_colors, check_space=True)
    entries = decoration.legend
    cols, rows = matrix.Cols_canvas, matrix.Rows_canvas
    label_width = max((len(entry.label) for entry in entries), default=0) + 2
    width, height = 3 + label_width, len(entries)
    if not entries or width > len(cols) or height > len(rows):
        return  # no room for a legend at all (as plotext decides)
    corner = legend_corner(matrix, width, height)
    first_col, top_row = corner
    for index, entry in enumerate(entries):
        row = top_row - index
        cells = [(" ", None, None)] + [(entry.marker, entry.color, entry.style)] * 2
        cells += [(char, *text_colors) for char in f" {entry.label}".ljust(label_width)]
        for offset, (char, color, style) in enumerate(cells):
            col = first_col + offset
            if matrix.get_marker(col, row) == " ":  # where the legend must overlap data, the data shows through
                matrix.insert_element(col, row, char, color, style)


def legend_corner(matrix, width: int, height: int) -> tuple[int, int]:
    """The (first column, top row) of the canvas corner whose ``width`` × ``height`` box holds the fewest data
    cells: top left, top right, bottom left, bottom right, the first of them on a tie."""
    cols, rows = matrix.Cols_canvas, matrix.Rows_canvas
    corners = [
        (first_col, top_row)
        for top_row in (rows[-1], rows[0] + height - 1)
        for first_col in (cols[0], cols[-1] - width + 1)
    ]

    def hidden(corner: tuple[int, int]) -> int:
        first_col, top_row = corner
        return sum(
            matrix.get_marker(col, row) != " "
            for row in range(top_row - height + 1, top_row + 1)
            for col in range(first_col, first_col + width)
        )

    return min(corners, key=hidden)


def legend_entry(figure: Plot, label: str) -> LegendEntry:
    """The legend's row for the line or scatter ``figure`` was given last: its colour as plotext resolved it."""
    monitor = cast(Any, figure).monitor  # plotext's internals (untyped): what it resolved for the last line
    marker = monitor.marker[-1][0] if monitor.marker[-1] else "•"
    color = monitor.color[-1][0] if monitor.color[-1] else "default"
    style = monitor.style[-1][0] if monitor.style[-1] else "default"
    return LegendEntry(label, color, style, hd_symbols.get(marker, marker))


class BudgetedPlot(PlotextPlot):
    """A PlotextPlot whose text is built in a worker thread, swapped in when it lands, and cached.

    ``render()`` never builds: it returns the text last built (or nothing yet) and, when that is not
    of the current data at the current size, asks for a build. One build per plot is in flight at a
    time; one that comes back stale (newer data, another size) is dropped and the newest asked for.
    """

    DEFAULT_CSS = """
    BudgetedPlot {
        width: 1fr;
        height: 1fr;
        min-height: 8;
    }
    """

    MIN_WIDTH = 16
    MIN_HEIGHT = 5

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None):
        super().__init__(name=name, id=id, classes=classes)
        self.last_render_seconds = 0.0
        """CPU seconds of the last build (its worker thread's)."""
        self.points_drawn = 0
        """How many points the last ``replot`` handed to plotext (all lines)."""
        self._drawn_size: tuple[int, int] | None = None
        self.data_version = 0
        """Counts replots: a build of the same version at the same size is reused."""
        self.renders = 0
        """How many times plotext built this plot's text."""
        self.shown: RenderKey | None = None
        """What the text on screen was built from."""
        self._shown_text: Content | None = None
        self._in_flight: RenderKey | None = None
        self._landed = asyncio.Event()
        self.axis_ticks: dict[str, list[str]] = {}
        """The tick labels the last replot gave each axis ("x", "y")."""

    def render(self):
        self._ensure_built()
        if self._too_small or self._shown_text is None:
            return Content("")  # until the first build lands; after, each newer one replaces the last
        return self._shown_text

    @property
    def _too_small(self) -> bool:
        return self.size.width < self.MIN_WIDTH or self.size.height < self.MIN_HEIGHT

    def _ensure_built(self) -> None:
        """Ask for a build of the current data at the current size, unless it is shown or one is in flight."""
        if self._too_small or self._in_flight is not None:
            return
        if tuple(self.size) != self._drawn_size:
            # Decimation depends on the width and the ticks on the height, which may have changed since replot().
            self._replot_at_size()
        key = RenderKey(self.data_version, self.size.width, self.size.height, self._plotext_theme)
        if key == self.shown:
            return
        self._in_flight = key
        self._landed.clear()
        figure, console = self.plt, self.app.console

        # A coroutine function, not a coroutine: a worker a closing app never starts leaves nothing unawaited.
        async def build() -> None:
            await self._build(key, figure, console)

        self.run_worker(build, group="plot-build")  # type: ignore[arg-type]  # Textual types it Coroutine[None, None, …]

    async def _build(self, key: RenderKey, figure: Plot, console: Console) -> None:
        def timed_build() -> tuple[Content, float]:
            started = time.thread_time()
            return build_text(figure, key, console), time.thread_time() - started

        try:
            text, seconds = await asyncio.to_thread(timed_build)
        finally:
            self._in_flight = None
            self._landed.set()
        self.renders += 1
        self.last_render_seconds = seconds
        if key.data_version == self.data_version:  # a build of newer data replaces this one below
            self.shown, self._shown_text = key, text
            self.refresh()
        self._ensure_built()  # the data or the size moved on while it was built: build the newest

    @property
    def building(self) -> bool:
        """Whether a build of this plot is in flight."""
        return self._in_flight is not None

    async def drawn(self) -> None:
        """Wait until the text shown is built from the current data at the current size (or is empty: too small)."""
        while True:
            self._ensure_built()
            if self._in_flight is None:
                return
            await self._landed.wait()

    def on_resize(self) -> None:
        self.refresh()  # render() replots at the new size and asks for its build

    @property
    def columns(self) -> int:
        """Points worth drawing across: about one per character column."""
        return max(self.size.width - 10, 20)

    def redraw(self) -> None:
        """Replot the current data and schedule a repaint (which asks for a build)."""
        self._replot_at_size()
        self.refresh()

    def _replot_at_size(self) -> None:
        self._drawn_size = (self.size.width, self.size.height)
        self.data_version += 1
        # A fresh figure: the one before may be in a worker thread being built. Its theme first:
        # lines without a colour take the next of the theme's colours as they are plotted.
        self._plot = DecoratedFigure()
        self._plot.theme(self._plotext_theme)
        self.axis_ticks = {}
        self.replot()

    @property
    def _plotext_theme(self) -> str:
        return self._get_plotext_theme_name(self.app.theme)

    def replot(self) -> None:
        """Plot the current data on ``self.plt``, decimated to the current width."""
        raise NotImplementedError

    def set_even_ticks(
        self,
        xs: Sequence[float] | None,
        ys: Sequence[float] | None,
        y_range: tuple[float, float] | None = None,
        *,
        x_min_step: float = 0.0,
    ) -> None:
        """``nice_ticks`` on each axis given (``xs``, ``ys``: the drawn values; None: plotext's own ticks),
        the axis' limits set to its first and last tick, the labels kept in ``axis_ticks``.

        ``x_min_step``: the x axis' smallest step between ticks (1 for steps and seconds: never "0.5 steps").
        """
        # A label per row at most (the rows between the title, the legend's first line and the x axis):
        # few ticks on a 1-2-5 step leave much of a short plot empty above the data.
        rows = max(self.size.height - 6, 2)
        for axis, values, most, min_step in (
            ("x", xs, max(3, min(6, self.columns // 10)), x_min_step),
            ("y", ys, max(3, min(6, rows)), 0.0),
        ):
            if not values:
                continue
            low, high = (y_range if axis == "y" else None) or (min(values), max(values))
            ticks, labels = nice_ticks(low, high, most, min_step=min_step)
            if len(ticks) < 2:  # one tick is one value: plotext cannot span an axis of width 0
                continue
            if axis == "x":
                self.plt.xticks(ticks, labels)
                self.plt.xlim(ticks[0], ticks[-1])
            else:
                self.plt.yticks(ticks, labels)
                self.plt.ylim(ticks[0], ticks[-1])
            self.axis_ticks[axis] = labels

    @property
    def decoration(self) -> Decoration:
        """The legend and y label drawn on the current figure as it is built."""
        return getattr(self.plt, "decoration", Decoration())

    @decoration.setter
    def decoration(self, decoration: Decoration) -> None:
        self.plt.decoration = decoration  # type: ignore[attr-defined]  # a DecoratedFigure (replot's own)

    def add_to_legend(self, label: str) -> None:
        """List the line or scatter just given to ``self.plt`` in the legend, under ``label``."""
        self.decoration = replace(self.decoration, legend=(*self.decoration.legend, legend_entry(self.plt, label)))


async def plots_drawn(node: DOMNode) -> None:
    """Wait until no plot under ``node`` (a screen, a view) has a build in flight: for screenshots and tests."""
    while pending := [plot for plot in node.query(BudgetedPlot) if plot.building]:
        for plot in pending:
            await plot.drawn()


# The smallest step whose power of ten is a normal float: below it, 10 ** floor(log10(step)) underflows.
MIN_TICK_STEP = 1e-300


# Tick labels carry at most this many significant digits: a rate of 7987.2 reads 7980 7990, never 7987.2 7987.4.
TICK_DIGITS = 4


def nice_ticks(low: float, high: float, most: int = 5, *, min_step: float = 0.0) -> tuple[list[float], list[str]]:
    """At most ``most`` evenly spaced ticks on a 1-2-5 × 10^k step that cover [low, high], and their labels.

    plotext's own ticks fall at uneven places (``100.0, 83.3, 50.0``) and may stop short of the
    data (an axis ending at 18.2 for steps to 24); labels carry the step's decimals, no more.
    One value (a single epoch's examples/s, one telemetry sample) gets an axis from 0 to it, where
    plotext would put it between two thirds and four thirds of itself (``58.5 87.8 117.0``). The
    step is at least ``min_step`` and keeps labels to ``TICK_DIGITS`` significant digits.
    """
    if not (math.isfinite(low) and math.isfinite(high)):
        return [], []
    if high < low:
        low, high = high, low
    if high == low:
        low, high = (0.0, 1.0) if low == 0 else (min(0.0, low), max(0.0, high))
    most = max(most, 3)  # ticks are multiples of the step: a range across 0 takes three
    largest = max(abs(low), abs(high))
    coarsest_useful = 10 ** (math.floor(math.log10(largest)) - TICK_DIGITS + 1) if largest >= MIN_TICK_STEP else 0.0
    raw = max((high - low) / (most - 1), min_step, coarsest_useful)
    if not math.isfinite(raw) or raw < MIN_TICK_STEP:
        # A span too wide for a float (1e308 apart) or too narrow for a power of ten (5e-324): one value.
        return [low], [format_tick(low, 0)]
    magnitude = 10 ** math.floor(math.log10(raw))
    candidates = (factor * magnitude * 10**power for power in range(4) for factor in (1, 2, 5))
    for step in candidates:
        if step < raw:
            continue
        first, last = math.floor(low / step), math.ceil(high / step)
        if last - first + 1 <= most:
            break
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    ticks = [round(index * step, decimals + 1) for index in range(first, last + 1)]
    return ticks, [format_tick(tick, decimals) for tick in ticks]


def format_tick(value: float, decimals: int) -> str:
    text = f"{value:.{decimals}f}"
    return text.lstrip("-") if float(text) == 0 else text  # never "-0.0"


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
        if not drawn:
            plt.title(f"{self.title} (waiting for data)")
        self.points_drawn = drawn

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
