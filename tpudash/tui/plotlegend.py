"""A plot's legend and its y axis' label, drawn on the figure plotext built, where they hide the fewest data.

The legend goes in the corner of the canvas that hides the fewest data
(none, as a rule: a falling loss keeps its legend top right, a rising
accuracy top left), and wherever it must overlap, the data shows through
it; the y label sits above the y axis, where one reads it. plotext's own
would put the legend top left over the data and the y label under the x
axis. The plots (``tpudash.tui.plotwidget``) draw on a ``DecoratedFigure``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from plotext._dict import hd_symbols
from plotext._figure import _figure_class
from textual_plotext.plot import Plot

from tpudash.tui.plotraster import PlotFrames, draw_signals, restore_signals, take_signals


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


class DecoratedFigure(Plot):
    """A plotext figure that draws its ``decoration`` on the matrix plotext built, before its text is made."""

    decoration = Decoration()
    frames: PlotFrames | None = None
    """The plot's last frame, reused while only the data change (None: plotext draws every frame)."""

    def _set_master(self) -> None:
        # plotext's master figure makes a stand-in figure for subplots, whose monitor is a deep copy of the
        # master's, still as new here: a new monitor is that copy at a twelfth of the cost, and a plot makes
        # a figure at every replot, on the UI thread (issue 37).
        figure: Any = self  # plotext's internals: typed neither by plotext nor by textual-plotext
        monitor = figure.monitor
        monitor.copy = type(monitor)
        try:
            _figure_class._set_master(figure)
        finally:
            del monitor.copy

    def _build_matrix(self) -> None:
        figure: Any = self  # plotext's internals: typed neither by plotext nor by textual-plotext
        monitor = figure.monitor
        # plotext draws the frame, plotraster the lines and dots (the same cells, a fraction of the cost).
        signals = take_signals(monitor) if figure._no_plots else None
        if signals is None:
            _figure_class._build_matrix(figure)
        else:
            try:
                frames = self.frames
                key = PlotFrames.key(monitor) if frames is not None else ""
                if frames is None or not frames.reuse(monitor, key):  # no frame kept for this figure: plotext draws it
                    _figure_class._build_matrix(figure)
                    if frames is not None:
                        frames.keep(monitor, key)
                draw_signals(monitor, signals)
            finally:
                restore_signals(monitor, signals)
        decorate(monitor, self.decoration)


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
