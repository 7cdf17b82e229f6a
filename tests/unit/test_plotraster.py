"""A plot's lines and dots drawn by tpudash.tui.plotraster are the very cells plotext draws, for any figure.

Every figure is made twice from one description: one is built as the
dashboard builds it (``DecoratedFigure``: plotext draws the frame, plotraster
the data), the other by plotext alone. Their matrices must match cell for
cell: character, colour, style and background.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from plotext._figure import _figure_class
from textual_plotext.plot import Plot

from tpudash.tui import plotraster
from tpudash.tui.plotlegend import DecoratedFigure, Decoration, decorate


@dataclass(frozen=True)
class Line:
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    joined: bool  # plot() (a line) or scatter() (dots)
    marker: str
    color: Any


@dataclass(frozen=True)
class Figure:
    width: int
    height: int
    lines: tuple[Line, ...]
    x_limits: tuple[float, float]
    y_limits: tuple[float, float]
    vlines: tuple[float, ...] = ()
    extra: tuple[str, ...] = field(default=())  # "log y", "label", "text", "plotext's limits", "reversed x"
    x_labels: tuple[str, str] = ("low", "high")


def make(figure: Figure, kind: type[Plot] = DecoratedFigure) -> Any:
    """A figure as the dashboard's plots give plotext one: lines, a title, ticks and limits set on both axes."""
    plot = kind()
    plot.theme("pro")
    for line in figure.lines:
        draw = plot.plot if line.joined else plot.scatter
        label = "plotext's own legend" if "label" in figure.extra else None
        draw(list(line.xs), list(line.ys), marker=line.marker, color=line.color, label=label)
    for step in figure.vlines:
        plot.vline(step, color="orange")
    plot.title("loss")
    plot.xlabel("step")
    low, high = figure.x_limits
    if "plotext's limits" not in figure.extra:
        plot.xticks([low, high], list(figure.x_labels))
        plot.xlim(low, high)
    if "reversed x" in figure.extra:
        plot.xreverse(True)
    bottom, top = figure.y_limits
    plot.yticks([bottom, top], ["bottom", "top"])
    plot.ylim(bottom, top)
    if "log y" in figure.extra:
        plot.yscale("log")
    if "text" in figure.extra:
        plot.text("note", low, bottom)
    plot.plotsize(figure.width, figure.height)
    plot._set_size(figure.width, figure.height)
    plot._set_sizes()
    return plot


def matrix_of(plot: Any) -> tuple[Any, ...]:
    matrix = plot.monitor.matrix
    return matrix.marker, matrix.fullground, matrix.style, matrix.background


def built_by_plotext_alone(figure: Figure) -> tuple[Any, ...]:
    plot: Any = make(figure, Plot)  # plotext's own figure, set up as plotext sets it up
    _figure_class._build_matrix(plot)
    decorate(plot.monitor, Decoration())
    return matrix_of(plot)


def built_by_the_dashboard(figure: Figure, frames: plotraster.PlotFrames | None = None) -> tuple[Any, ...]:
    plot: Any = make(figure)
    plot.frames = frames
    plot._build_matrix()
    return matrix_of(plot)


def takes_over(figure: Figure) -> bool:
    plot: Any = make(figure)
    return plotraster.take_signals(plot.monitor) is not None


def lines_within(x_limits: tuple[float, float], y_limits: tuple[float, float]) -> st.SearchStrategy[Line]:
    """Lines and dots whose points lie within the limits or up to a span beyond them on any side (plotext draws
    every pixel of a segment, on the canvas or off it: a point a thousand spans away costs seconds)."""

    def around(low: float, high: float) -> st.SearchStrategy[float]:
        span = high - low
        return st.floats(min_value=low - span, max_value=high + span, allow_nan=False)

    points = st.lists(st.tuples(around(*x_limits), around(*y_limits)), max_size=60)
    return st.builds(
        lambda xy, joined, marker, color: Line(tuple(x for x, _ in xy), tuple(y for _, y in xy), joined, marker, color),
        points,
        st.booleans(),
        st.sampled_from(["braille", "braille", "●", "x"]),
        st.sampled_from([None, "cyan", "orange", (200, 40, 220), 105]),
    )


@st.composite
def figures(draw: st.DrawFn) -> Figure:
    low = draw(st.floats(min_value=-500, max_value=500))
    high = low + draw(st.floats(min_value=0.5, max_value=800))
    bottom = draw(st.floats(min_value=-500, max_value=500))
    top = bottom + draw(st.floats(min_value=0.5, max_value=800))
    return Figure(
        width=draw(st.integers(min_value=16, max_value=110)),
        height=draw(st.integers(min_value=5, max_value=30)),
        lines=tuple(draw(st.lists(lines_within((low, high), (bottom, top)), max_size=4))),
        x_limits=(low, high),
        y_limits=(bottom, top),
        # Recompile marks fall on steps; plotext itself fails on an axis spanning a subnormal number alone.
        vlines=tuple(draw(st.lists(st.floats(min_value=low, max_value=high, allow_subnormal=False), max_size=2))),
    )


@given(figures())
def test_the_dashboards_lines_and_dots_are_the_cells_plotext_draws(figure):
    assert takes_over(figure)
    assert built_by_the_dashboard(figure) == built_by_plotext_alone(figure)


def falling_loss(points: int = 300) -> Figure:
    """A live loss plot as the run view draws one: noisy dots, a smoothed line, the epochs' values with markers."""
    steps = range(points)
    noisy = tuple(2.0 * math.exp(-step / 90) + 0.2 * math.sin(step * 1.7) for step in steps)
    smooth = tuple(2.0 * math.exp(-step / 90) for step in steps)
    epochs = range(0, points, 40)
    return Figure(
        width=88,
        height=14,
        lines=(
            Line(tuple(map(float, steps[::3])), noisy[::3], False, "braille", "cyan"),
            Line(tuple(map(float, steps[::3])), smooth[::3], True, "braille", None),
            Line(tuple(map(float, epochs)), tuple(smooth[step] for step in epochs), True, "braille", "orange"),
            Line(tuple(map(float, epochs)), tuple(smooth[step] for step in epochs), False, "●", "orange"),
        ),
        x_limits=(0.0, float(points)),
        y_limits=(-0.5, 2.5),
        vlines=(120.0,),
    )


def test_a_live_loss_plot_is_drawn_by_plotraster_and_shows_its_lines():
    figure = falling_loss()
    assert takes_over(figure)
    dashboard = built_by_the_dashboard(figure)
    assert dashboard == built_by_plotext_alone(figure)
    markers = "".join("".join(row) for row in dashboard[0])
    assert sum("⠁" <= char <= "⣿" for char in markers) > 100  # the lines are there, in braille
    assert "●" in markers


def test_lines_that_run_off_the_canvas_are_cut_where_plotext_cuts_them():
    """Lines beyond the limits on every side, each alone (a line drawn later would hide a difference): plotext's
    pixels along a segment are truncated toward zero, so a line leaving through the bottom or entering from the
    left lights the canvas' first row or column as plotext's does."""
    loss = falling_loss()
    steps = tuple(map(float, range(300)))
    smooth = loss.lines[1]
    zigzag = Line(steps, tuple((-1.0) ** step * (3.0 + step % 7) for step in range(300)), True, "braille", "green")
    rising = Line(steps, tuple(step / 100 for step in range(300)), True, "braille", "green")
    steep = Line((-0.6, 0.3, 50.0), (-2.5, 10.0, 0.0), True, "braille", "green")
    for line, x_limits, y_limits in [
        (smooth, (0.0, 300.0), (0.3, 1.2)),  # leaves through the bottom, a pixel at a time
        (smooth, (30.0, 250.0), (-0.5, 1.0)),  # enters from the top and the left
        (zigzag, (55.5, 61.0), (-2.0, 2.0)),  # crosses the top and the bottom at every step
        (rising, (101.0, 200.0), (0.5, 3.5)),  # enters from the left, and from below
        (steep, (0.0, 100.0), (-2.0, 2.0)),  # enters from the left, steeply, halfway up
    ]:
        figure = Figure(**{**loss.__dict__, "x_limits": x_limits, "y_limits": y_limits, "lines": (line,), "vlines": ()})
        assert takes_over(figure)
        assert built_by_the_dashboard(figure) == built_by_plotext_alone(figure), (x_limits, y_limits)


@pytest.mark.parametrize(
    "why",
    [
        ("log y",),  # plotext takes logarithms of data and ticks as it builds
        ("label",),  # plotext's own legend goes over the data
        ("text",),  # so does its text
        ("plotext's limits",),  # without data plotext would find no limits or ticks
    ],
)
def test_a_figure_plotraster_cannot_draw_exactly_is_left_whole_to_plotext(why):
    loss = falling_loss()
    # A logarithmic axis: the smoothed and per-epoch values, all above 0, on limits above 0.
    lines, y_limits = (loss.lines[1:], (0.05, 2.5)) if "log y" in why else (loss.lines, loss.y_limits)
    figure = Figure(**{**loss.__dict__, "lines": lines, "y_limits": y_limits, "extra": why})
    assert not takes_over(figure)
    assert built_by_the_dashboard(figure) == built_by_plotext_alone(figure)


@pytest.mark.parametrize(
    "line",
    [
        Line((0.0, 50.0, 100.0), (1.0, math.nan, 0.5), True, "braille", "cyan"),  # plotext breaks a line at a NaN
        Line((0.0, 50.0, 100.0), (1.0, 2.0, 0.5), True, "hd", "cyan"),  # plotext's 2×2 blocks
    ],
)
def test_a_line_plotraster_cannot_draw_exactly_leaves_the_figure_to_plotext(line):
    figure = Figure(**{**falling_loss().__dict__, "lines": (*falling_loss().lines, line)})
    assert not takes_over(figure)
    assert built_by_the_dashboard(figure) == built_by_plotext_alone(figure)


def test_a_built_figure_still_holds_the_data_it_was_given():
    figure = falling_loss()
    given_plot: Any = make(figure)
    given = [list(getattr(given_plot.monitor, name)) for name in ("x", "y", "marker", "color", "style")]
    plot: Any = make(figure)
    plot._build_matrix()
    assert [list(getattr(plot.monitor, name)) for name in ("x", "y", "marker", "color", "style")] == given


@st.composite
def plots_over_time(draw: st.DrawFn) -> list[Figure]:
    """One plot's figures, build after build, as a live plot's: each line's points anew (its marker and colour
    kept); now and then new limits, tick labels, size, a recompile mark, a reversed axis, limits left to plotext."""
    figure = draw(figures())
    shown = [figure]
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        moved = [draw(lines_within(figure.x_limits, figure.y_limits)) for _ in figure.lines]
        figure = replace(
            figure,
            lines=tuple(replace(line, xs=new.xs, ys=new.ys) for line, new in zip(figure.lines, moved, strict=True)),
        )
        change = draw(
            st.sampled_from(
                ["data", "data", "data", "x limits", "tick labels", "size", "vline", "reversed x", "plotext's limits"]
            )
        )
        if change == "x limits":
            low, high = figure.x_limits
            figure = replace(figure, x_limits=(low, high + draw(st.floats(min_value=0.5, max_value=100))))
        elif change == "tick labels":
            figure = replace(figure, x_labels=(figure.x_labels[0], figure.x_labels[1] + "+"))
        elif change == "size":
            figure = replace(figure, width=draw(st.integers(min_value=16, max_value=110)))
        elif change == "vline":
            figure = replace(figure, vlines=(*figure.vlines, sum(figure.x_limits) / 2))
        elif change in ("reversed x", "plotext's limits"):
            figure = replace(figure, extra=(change,) if change not in figure.extra else ())
        shown.append(figure)
    return shown


@given(plots_over_time())
def test_a_plots_frame_kept_from_the_build_before_is_the_frame_plotext_would_draw(shown):
    frames = plotraster.PlotFrames()
    for figure in shown:
        assert built_by_the_dashboard(figure, frames) == built_by_plotext_alone(figure)


@pytest.mark.parametrize("extra", [(), ("reversed x",)])
def test_a_plot_whose_data_grow_within_its_ticks_draws_its_frame_once(extra):
    loss = replace(falling_loss(), extra=extra)  # reversed: plotext's built limits are the given ones, reversed
    frames = plotraster.PlotFrames()
    for points in (120, 180, 240, 300):  # the live plot's data grow; its ticks (0 to 300) stay
        figure = replace(loss, lines=falling_loss(points).lines)
        assert built_by_the_dashboard(figure, frames) == built_by_plotext_alone(figure), points
    assert frames.reused == 3
    wider = replace(loss, x_limits=(0.0, 400.0))  # past the last tick: a new frame
    assert built_by_the_dashboard(wider, frames) == built_by_plotext_alone(wider)
    assert frames.reused == 3
