"""The plot widget: a textual-plotext plot whose text is built off the UI thread, cached, and rebuilt only when its data, size or theme change.

Each plot (``tpudash.tui.plots``) subclasses ``BudgetedPlot`` and has one
``replot()`` that turns the current data into a figure (``self.plt``, a
fresh plotext figure each time). plotext then draws the figure in pure
Python (a few ms at 60×18, far more on a loaded machine): that happens in a
thread, one build per plot at a time, and the drawing, read straight from
plotext's matrix (``tpudash.tui.plotcells``), is swapped in on the UI
thread as strips the widget hands out line by line, so keys never wait for
a plot and a repaint costs next to nothing. A plot is built again only when
its data, its size or the theme changed (the run view redraws on its
display beat): a dashboard that steals a core from training would cost its
user the very throughput they are watching.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from rich.style import Style as RichStyle
from textual.content import Content
from textual.dom import DOMNode
from textual.geometry import Region, Size
from textual.strip import Strip
from textual_plotext import PlotextPlot
from textual_plotext.plot import Plot

from tpudash.tui import plotcells
from tpudash.tui.plotcells import CellStyles, PlotRows
from tpudash.tui.plotlegend import DecoratedFigure, Decoration, legend_entry
from tpudash.tui.plotraster import PlotFrames
from tpudash.tui.plotticks import nice_ticks


@dataclass(frozen=True)
class RenderKey:
    """What a plot's text depends on: its data (counted by replots), its size and its plotext theme."""

    data_version: int
    width: int
    height: int
    theme: str


def build_rows(figure: Plot, key: RenderKey) -> PlotRows:
    """plotext's drawing of ``figure`` at ``key``'s size and theme, as rows of runs: runs in a worker thread.

    Only ``figure`` is written, and nothing else holds it: every replot draws on a fresh figure.
    """
    return plotcells.build_rows(figure, key.width, key.height, key.theme)


def timed_build(figure: Plot, key: RenderKey) -> tuple[PlotRows, float]:
    """``build_rows`` and the CPU seconds it took (its thread's)."""
    started = time.thread_time()
    return build_rows(figure, key), time.thread_time() - started


_plot_builds: ThreadPoolExecutor | None = None


def plot_build_thread() -> ThreadPoolExecutor:
    """The one thread every plot is built on, one build after another (plotext's drawing holds the GIL anyway)."""
    global _plot_builds
    if _plot_builds is None:
        _plot_builds = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpudash-plot-build")
    return _plot_builds


class BudgetedPlot(PlotextPlot):
    """A PlotextPlot whose text is built in a worker thread, swapped in when it lands, and cached.

    A repaint never builds: it hands out the strips last built (or blank lines yet) and, when they are
    not of the current data at the current size, asks for a build. One build per plot is in flight at a
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
        self._shown_rows: PlotRows | None = None
        self._shown_strips: list[Strip] = []
        self._cell_styles = CellStyles()
        self._frames = PlotFrames()
        self._in_flight: RenderKey | None = None
        self._landed = asyncio.Event()
        self.build_error: str | None = None
        """Why the last build failed (None: it did not)."""
        self._failed: RenderKey | None = None
        """What the failed build was of: not asked for again (its data or size must move first)."""
        self.axis_ticks: dict[str, list[str]] = {}
        """The tick labels the last replot gave each axis ("x", "y")."""

    def render_lines(self, crop: Region) -> list[Strip]:
        self._ensure_built()
        if self._shown_rows is not None and self._cell_styles.look != self.visual_style:
            self._shown_strips = self._cell_styles.strips(self, self._shown_rows)  # the widget's look changed (theme)
        # The width and look once for all lines: a widget's size is found through its screen's map, each time.
        size = self.size
        self._painting = (size.width, self._too_small_at(size), self.visual_style.rich_style)
        try:
            return super().render_lines(crop)
        finally:
            self._painting = None

    _painting: tuple[int, bool, RichStyle] | None = None

    def render_line(self, y: int) -> Strip:
        """Line ``y`` of the plot last built (blank until the first build lands, or while too small)."""
        width, too_small, look = self._painting or (self.size.width, self._too_small, self.visual_style.rich_style)
        if too_small or not 0 <= y < len(self._shown_strips):
            return Strip.blank(width, look)
        return self._shown_strips[y].adjust_cell_length(width, look)

    def render(self) -> Content:
        """The plot's text as shown, without its styles (what tests read; painting goes through ``render_line``)."""
        self._ensure_built()
        if self._too_small:
            return Content("")
        return Content("\n".join(strip.text for strip in self._shown_strips))

    @property
    def _too_small(self) -> bool:
        return self._too_small_at(self.size)

    def _too_small_at(self, size: Size) -> bool:
        # A widget's size is looked up through its screen's map at each read: callers read it once.
        return size.width < self.MIN_WIDTH or size.height < self.MIN_HEIGHT

    def _ensure_built(self) -> None:
        """Ask for a build of the current data at the current size, unless it is shown or one is in flight."""
        if self._in_flight is not None:
            return
        size = self.size
        if self._too_small_at(size):
            return
        if tuple(size) != self._drawn_size:
            # Decimation depends on the width and the ticks on the height, which may have changed since replot().
            self._replot_at_size()
        key = RenderKey(self.data_version, size.width, size.height, self._plotext_theme)
        if key == self.shown or key == self._failed:
            return
        self._in_flight = key
        self._landed.clear()
        # On the plots' own thread, without a Textual worker: a worker's set-up, its state messages and asyncio's
        # executor hand-off cost the UI thread more than the landing of the build itself (issue 37).
        build = asyncio.get_running_loop().run_in_executor(plot_build_thread(), timed_build, self.plt, key)
        build.add_done_callback(lambda done: self._land(key, done))

    def _land(self, key: RenderKey, build: asyncio.Future[tuple[PlotRows, float]]) -> None:
        """A build came back (on the UI thread): show it if it is of the current data, then build the newest."""
        self._in_flight = None
        self._landed.set()
        if build.cancelled() or not self.is_attached:
            return  # the app closed, or the plot left the screen, while it was built
        error = build.exception()
        if error is not None:
            # The old text stays; the next change of data or size asks again. A plot never takes the app down.
            self.build_error = f"{type(error).__name__}: {error}"
            self._failed = key
            self.log.error(f"plot build failed: {self.build_error}")
            return
        rows, seconds = build.result()
        self.renders += 1
        self.last_render_seconds = seconds
        self.build_error = None
        if key.data_version == self.data_version:  # a build of newer data replaces this one below
            shown = self.shown
            before = self._shown_strips if shown is not None and shown.width == key.width else None
            self.shown, self._shown_rows = key, rows
            self._shown_strips = self._cell_styles.strips(self, rows)
            self._repaint_changed_rows(before)
        self._ensure_built()  # the data or the size moved on while it was built: build the newest

    def _repaint_changed_rows(self, before: list[Strip] | None) -> None:
        """Repaint the rows that differ from ``before`` (the strips shown until now), or all if it cannot tell.

        About half a live plot's rows change from one build to the next: the others keep their painted lines,
        and the frame writes only the rows that moved.
        """
        after = self._shown_strips
        if before is None or len(before) != len(after):
            self.refresh()
            return
        width = self.size.width
        changed = [Region(0, y, width, 1) for y, (old, new) in enumerate(zip(before, after)) if old != new]
        if changed:
            self.refresh(*changed)

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
        """Replot the current data and have it built; the plot repaints once, when the build lands.

        A plot on show asks for its build here rather than through a repaint: a repaint now would only draw
        the old text again (a few milliseconds of the UI thread per plot, every second while a job trains).
        A plot not on show (another screen's, a hidden tab's) repaints when shown, and asks for its build then.
        """
        self._replot_at_size()
        if self.is_on_screen and self.screen.is_current:  # a suspended screen keeps its last layout's map
            self._ensure_built()
        else:
            self.refresh()

    def _replot_at_size(self) -> None:
        size = self.size
        self._drawn_size = (size.width, size.height)
        self.data_version += 1
        # A fresh figure: the one before may be in a worker thread being built. Its theme first:
        # lines without a colour take the next of the theme's colours as they are plotted.
        self._plot = DecoratedFigure()
        self._plot.frames = self._frames  # one build at a time: the frames are this plot's, never shared
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
