"""The plot widget: a textual-plotext plot whose text is built off the UI thread, cached, and rebuilt only when its data, size or theme change.

Each plot (``tpudash.tui.plots``) subclasses ``BudgetedPlot`` and has one
``replot()`` that turns the current data into a figure (``self.plt``, a
fresh plotext figure each time). plotext then builds the figure's text in
pure Python (about 10 ms at 160×24, far more on a loaded machine): that
happens in a thread, one build per plot at a time, and the result is
swapped in on the UI thread, so keys never wait for a plot. A plot is built
again only when its data, its size or the theme changed (the run view
redraws on its display beat): a dashboard that steals a core from training
would cost its user the very throughput they are watching.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from rich.console import Console
from rich.text import Text
from textual.content import Content
from textual.dom import DOMNode
from textual_plotext import PlotextPlot
from textual_plotext.plot import Plot

from tpudash.tui.plotlegend import DecoratedFigure, Decoration, legend_entry
from tpudash.tui.plotticks import nice_ticks


@dataclass(frozen=True)
class RenderKey:
    """What a plot's text depends on: its data (counted by replots), its size and its plotext theme."""

    data_version: int
    width: int
    height: int
    theme: str


def build_text(figure: Plot, key: RenderKey, console: Console) -> Content:
    """plotext's build of ``figure`` at ``key``'s size and theme, as Textual content: runs in a worker thread.

    Only ``figure`` is written, and nothing else holds it: every replot draws on a fresh figure.
    """
    figure.plotsize(key.width, key.height)
    figure._set_size(key.width, key.height)  # as PlotextPlot.render does: plotsize alone leaves resizes wrong
    figure.theme(key.theme)
    return Content.from_rich_text(Text.from_ansi(figure.build()), console=console)


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
