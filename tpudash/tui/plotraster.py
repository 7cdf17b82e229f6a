"""A figure's lines and dots drawn as plotext draws them, cell for cell, at a fraction of plotext's cost.

plotext draws a line by listing every sub-cell pixel between each pair of
points, then sorts those pixels through generic list-of-lists helpers (a
set to drop duplicates, a dict of 4×2 grids per braille cell, a filter for
pixels off the canvas) and inserts each cell into its matrix one call at a
time. For a live metric plot (88×12, a noisy scatter and two lines) that is
four fifths of the whole build: 8–9 ms of the 10, once per plot per second
while a job trains, CPU the training beside the dashboard needs (issue 37).

``take_signals`` lifts a figure's data out before plotext builds it, so
plotext draws the frame (axes, ticks, title, vertical lines) and no data;
``draw_signals`` then puts each line or scatter on the built matrix the way
plotext would have: the same mapping to pixels (plotext's own
``get_matrix_data``), the same pixels along each segment, the same braille
character per cell (plotext's own table), the same clipping, each signal
over the ones before it. It takes over only what it draws exactly:
braille and one-character markers, explicit limits and ticks on both axes
(without data plotext would not find them), linear scales, finite numbers,
no fills, no plotext labels or texts. Any other figure is left to plotext
whole. ``tests/unit/test_plotraster.py`` checks the two matrices are the
same, cell for cell, over random figures.

A plot's frame is mostly the same from one build to the next (its ticks
move on a 1-2-5 step, only when the data pass the last one): ``PlotFrames`` keeps the
last frame plotext drew for a plot, keyed by everything of the figure but
its data, and hands a copy of it to the next build with the same key.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from plotext._dict import braille_codes
from plotext._utility import get_matrix_data

BRAILLE = "braille"
# Braille sub-cell pixels: 2 across, 4 down. plotext lists a cell's pixels top row first, left to right.
BRAILLE_COLUMNS, BRAILLE_ROWS = 2, 4
BRAILLE_CHARACTERS = tuple(
    braille_codes[tuple((bits >> index) & 1 for index in range(BRAILLE_COLUMNS * BRAILLE_ROWS))] for bits in range(256)
)
"""The character plotext draws for each set of lit pixels (bit i: the i-th of plotext's list of a cell's pixels)."""


@dataclass(frozen=True)
class Signal:
    """One of a figure's lines or scatters, as plotext was given it."""

    xs: list[Any]
    ys: list[Any]
    marker: str
    color: Any
    style: Any
    lines: bool


def take_signals(monitor: Any) -> list[Signal] | None:
    """Lift every signal's data out of plotext's ``monitor`` (its figure about to be built), or None, leaving the
    figure untouched, when plotext must draw them itself (see the module's docstring)."""
    default = monitor.default
    if (
        monitor.fast_plot
        or monitor.text
        or any(label is not None for label in monitor.label)
        or any(monitor.fillx)
        or any(monitor.filly)
        or any(side != default.xside[0] for side in monitor.xside)
        or any(side != default.yside[0] for side in monitor.yside)
        or any(monitor.x_date)
        or any(monitor.y_date)
        or monitor.xscale[0] != default.xscale[0]
        or monitor.yscale[0] != default.yscale[0]
        or None in monitor.xlim[0]
        or None in monitor.ylim[0]
        or monitor.xticks[0] is None
        or monitor.yticks[0] is None
    ):
        return None
    signals = []
    for index in range(len(monitor.x)):
        signal = _signal(monitor, index)
        if signal is None:
            return None
        signals.append(signal)
    for index in range(len(signals)):
        monitor.x[index], monitor.y[index] = [], []
        monitor.marker[index], monitor.color[index], monitor.style[index] = [], [], []
    return signals


def _signal(monitor: Any, index: int) -> Signal | None:
    """Signal ``index`` of ``monitor``, if it is one plotext draws as ``draw_signals`` does: one marker, colour
    and style for all its points, a braille or one-character marker, and finite numbers."""
    xs, ys = monitor.x[index], monitor.y[index]
    markers, colors, styles = monitor.marker[index], monitor.color[index], monitor.style[index]
    if not (len(xs) == len(ys) == len(markers) == len(colors) == len(styles)):
        return None
    if not xs:
        return Signal(xs, ys, BRAILLE, None, None, bool(monitor.lines[index]))
    marker, color, style = markers[0], colors[0], styles[0]
    if marker != BRAILLE and len(marker) != 1:
        return None  # plotext's other sub-cell markers (hd, fhd): left to plotext
    if any(other != marker for other in markers) or any(other != color for other in colors):
        return None
    if any(other != style for other in styles):
        return None
    if not (_all_finite(xs) and _all_finite(ys)):
        return None
    return Signal(xs, ys, marker, color, style, bool(monitor.lines[index]))


def _all_finite(values: list[Any]) -> bool:
    """Whether ``values`` are all numbers and none is infinite or NaN (plotext breaks a line at a NaN)."""
    try:
        return math.isfinite(math.fsum(values))  # exact: a sum is infinite or NaN only if a value is
    except (TypeError, OverflowError):
        return False  # not numbers (dates as text), or finite values beyond a float's range together


def restore_signals(monitor: Any, signals: list[Signal]) -> None:
    """Give ``monitor`` back the data ``take_signals`` lifted out (a built figure reads as the one given)."""
    for index, signal in enumerate(signals):
        count = len(signal.xs)
        monitor.x[index], monitor.y[index] = signal.xs, signal.ys
        monitor.marker[index] = [signal.marker] * count
        monitor.color[index] = [signal.color] * count
        monitor.style[index] = [signal.style] * count


def draw_signals(monitor: Any, signals: list[Signal]) -> None:
    """Draw ``signals`` on ``monitor``'s built matrix as plotext draws them, each over the ones before it."""
    matrix = monitor.matrix
    columns, rows = matrix.Cols_canvas, matrix.Rows_canvas
    width, height = len(columns), len(rows)
    if width * height == 0:
        return
    xlim, ylim = monitor.xlim[0], monitor.ylim[0]  # as built: plotext's final limits (reversed if asked)
    markers, colors, styles = matrix.marker, matrix.fullground, matrix.style
    for signal in signals:
        if not signal.xs:
            continue
        # What matrix.insert_element does, cell by cell, without its checks: every cell is on the canvas.
        for (column, row), character in signal_cells(signal, xlim, ylim, width, height).items():
            column, row = column + columns.start, row + rows.start
            markers[row][column] = character
            if signal.color is not None:
                colors[row][column] = signal.color
            if signal.style is not None:
                styles[row][column] = signal.style


def signal_cells(
    signal: Signal, xlim: list[float], ylim: list[float], width: int, height: int
) -> dict[tuple[int, int], str]:
    """The canvas cells ``signal`` lights, (column, row) from the canvas' bottom left, and the character of each."""
    braille = signal.marker == BRAILLE
    across, down = (BRAILLE_COLUMNS, BRAILLE_ROWS) if braille else (1, 1)
    xs = get_matrix_data(signal.xs, xlim, width * across)
    ys = get_matrix_data(signal.ys, ylim, height * down)
    if signal.lines:
        xs, ys = _segments(xs, ys)
    if not braille:
        return {(x, y): signal.marker for x, y in zip(xs, ys) if 0 <= x < width and 0 <= y < height}
    lit: dict[tuple[int, int], int] = {}
    for x, y in zip(xs, ys):
        cell = (x // across, y // down)
        lit[cell] = lit.get(cell, 0) | 1 << ((down - 1 - y % down) * across + x % across)
    return {
        (column, row): BRAILLE_CHARACTERS[bits]
        for (column, row), bits in lit.items()
        if 0 <= column < width and 0 <= row < height
    }


def _segments(xs: list[int], ys: list[int]) -> tuple[list[int], list[int]]:
    """Every pixel plotext draws along the segments between consecutive points (``plotext._utility.get_lines``):
    ``max(|dx|, |dy|)`` evenly spaced pixels a segment, truncated toward zero, its end left to the next one."""
    line_xs: list[int] = []
    line_ys: list[int] = []
    for x0, y0, x1, y1 in zip(xs, ys, xs[1:], ys[1:]):
        steps = max(abs(x1 - x0), abs(y1 - y0))
        if steps == 0:
            continue
        x_slope, y_slope = (x1 - x0) / steps, (y1 - y0) / steps
        line_xs.extend(int(x0 + step * x_slope) for step in range(steps))
        line_ys.extend(int(y0 + step * y_slope) for step in range(steps))
    if xs:
        line_xs.append(xs[-1])
        line_ys.append(ys[-1])
    return line_xs, line_ys


# What a figure's frame does not depend on: its data (lifted out by take_signals), its matrix (the frame
# itself), plotext's fixed defaults, and the colours given to lines (those choose only lines' colours).
NOT_OF_THE_FRAME = frozenset({"matrix", "default", "x", "y", "marker", "color", "style", "past_colors"})


class PlotFrames:
    """The last frame plotext drew for one plot, reused while the figure but its data stays the same.

    One build of a plot runs at a time (``tpudash.tui.plotwidget``), so one plot's frames need no lock.
    """

    def __init__(self) -> None:
        self._key: str | None = None
        self._frame: Any = None
        self._limits: tuple[Any, Any] = (None, None)
        self.reused = 0
        """How many builds took their frame from here rather than from plotext."""

    @staticmethod
    def key(monitor: Any) -> str:
        """Everything plotext's frame is drawn from, once ``take_signals`` has lifted the data out."""
        state = {name: value for name, value in vars(monitor).items() if name not in NOT_OF_THE_FRAME}
        state["date"] = vars(monitor.date)
        return repr(sorted(state.items()))

    def reuse(self, monitor: Any, key: str) -> bool:
        """Put a copy of the frame kept for ``key`` on ``monitor`` as plotext would have built it, if there is one."""
        if key != self._key:
            return False
        monitor.matrix = _copied_matrix(self._frame)
        monitor.xlim, monitor.ylim = copy.deepcopy(self._limits)  # as built: draw_signals reads the final limits
        self.reused += 1
        return True

    def keep(self, monitor: Any, key: str) -> None:
        """Keep ``monitor``'s frame, just built by plotext, for the next build with ``key``."""
        self._key, self._frame = key, _copied_matrix(monitor.matrix)
        self._limits = copy.deepcopy((monitor.xlim, monitor.ylim))


def _copied_matrix(matrix: Any) -> Any:
    """plotext's matrix with its cells copied: what is drawn on the copy leaves the original as it was."""
    copied = copy.copy(matrix)
    for layer in ("marker", "fullground", "style", "background"):
        setattr(copied, layer, [row[:] for row in getattr(matrix, layer)])
    return copied
