"""A plot's text straight from plotext's built matrix: runs of equally coloured cells, then Textual strips.

plotext's own ``build()`` writes its matrix out as one ANSI string, cell by
cell, and a Textual widget then parses that string back (``Text.from_ansi``),
turns it into ``Content`` and lays the content out into lines at every
repaint. That round trip cost as much as plotext's drawing: with a plot
repainted once a second per metric while a job trains, it was a large part
of what the dashboard took from training's cores (issue 37). Here the
matrix is read directly, in the build's worker thread, into rows of runs;
on the UI thread a run's colours become the very style Textual gives that
ANSI text (``CellStyles``, asked once per colour and theme), and each row
one ``Strip``, which the plot widget hands out line by line.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from plotext._utility import ansi_end, colors_to_ansi
from rich.segment import Segment
from rich.style import Style as RichStyle
from rich.text import Text
from textual.content import Content
from textual.strip import Strip
from textual.visual import Visual

if TYPE_CHECKING:
    from textual.style import Style
    from textual.widget import Widget
    from textual_plotext.plot import Plot

CellColors = tuple[Hashable, Hashable, Hashable]
"""plotext's (foreground, style, background) of a cell: a name, a 256-colour number or an RGB tuple each
(plotext turns an RGB colour given as a list into a tuple), so a run's colours key the style cache."""

PlotRows = tuple[tuple[tuple[str, CellColors], ...], ...]
"""The plot's rows, top first, each as runs of (text, colours) of equally coloured cells."""


def build_rows(figure: Plot, width: int, height: int, theme: str) -> PlotRows:
    """plotext's drawing of ``figure`` at this size and theme, as rows of runs: what ``figure.build()`` draws,
    without writing it out as ANSI text. Runs in a worker thread; only ``figure`` is written."""
    figure.plotsize(width, height)
    figure._set_size(width, height)  # as PlotextPlot.render does: plotsize alone leaves resizes wrong
    figure.theme(theme)
    plotext_figure: Any = figure  # plotext's internals: typed neither by plotext nor by textual-plotext
    plotext_figure._set_sizes()  # build() without set_canvas(): the same two steps, the same matrix
    plotext_figure._build_matrix()
    return matrix_rows(plotext_figure.monitor.matrix)


def matrix_rows(matrix: Any) -> PlotRows:
    """plotext's matrix (row 0 at the bottom; marker, colour and style per cell) as rows of runs, top row first."""
    rows = []
    for row in reversed(range(matrix.rows)):
        markers = matrix.marker[row]
        colors = list(zip(matrix.fullground[row], matrix.style[row], matrix.background[row], strict=True))
        runs = []
        start = 0
        for column in range(1, len(colors) + 1):
            if column == len(colors) or colors[column] != colors[start]:
                runs.append(("".join(markers[start:column]), colors[start]))
                start = column
        rows.append(tuple(runs))
    return tuple(rows)


class CellStyles:
    """The rich style Textual gives a cell of each plotext colour, on one widget at its current look.

    Each is found as Textual finds it for plotext's ANSI text, one cell of that colour through
    ``Text.from_ansi``, ``Content`` and ``Visual.to_strips``, so a plot drawn from runs looks exactly
    as one parsed from plotext's text; a new theme or a changed widget style starts the cache anew.
    A run's style also carries its place (``Strip.apply_offsets``'s), kept per colour and place: most
    of a plot (its axes, ticks, title, most of its lines) is where it was at the build before.
    """

    PLACED_STYLES_AT_MOST = 20_000
    """Styles kept with their places: a few plots' worth of cells; past it the cache starts anew."""

    def __init__(self) -> None:
        self._look: Style | None = None
        self._styles: dict[CellColors, RichStyle | None] = {}
        self._placed: dict[tuple[CellColors, int, int], RichStyle] = {}

    @property
    def look(self) -> Style | None:
        """The widget style the cached styles were found for (None: none found yet)."""
        return self._look

    def strips(self, widget: Widget, rows: PlotRows) -> list[Strip]:
        """``rows`` as one strip each, styled for ``widget`` (the UI thread: it reads the widget's styles)."""
        look = widget.visual_style
        if look != self._look or len(self._placed) > self.PLACED_STYLES_AT_MOST:
            self._look, self._styles, self._placed = look, {}, {}
        styles, placed = self._styles, self._placed
        strips = []
        for y, runs in enumerate(rows):
            segments = []
            x = 0
            for text, colors in runs:
                if (style := placed.get((colors, x, y))) is None:
                    if colors not in styles:
                        styles[colors] = self._style(widget, colors)
                    style = placed[colors, x, y] = self._placed_style(styles[colors], x, y)
                segments.append(Segment(text, style))
                x += len(text)
            strips.append(Strip(segments))
        return strips

    @staticmethod
    def _placed_style(style: RichStyle | None, x: int, y: int) -> RichStyle:
        """``style`` marked with the place of its run, as ``Strip.apply_offsets`` marks Textual's own text:
        a mouse selects and copies the plot as text."""
        offset = RichStyle.from_meta({"offset": (x, y)})
        return style + offset if style else offset

    @staticmethod
    def _style(widget: Widget, colors: CellColors) -> RichStyle | None:
        ansi = Text.from_ansi(colors_to_ansi(*colors) + "x" + ansi_end)
        cell = Visual.to_strips(
            widget, Content.from_rich_text(ansi, console=widget.app.console), 1, 1, widget.visual_style
        )
        return next(iter(cell[0])).style if cell else None
