"""A plot drawn from plotext's matrix looks exactly as plotext's own text does in Textual (issue 37).

The plot widget no longer writes plotext's matrix out as ANSI text to parse it back: it reads the
matrix into runs of cells and styles each run as Textual styles that ANSI text. What the user sees
must not change: every cell's character and style is compared with plotext's own ``build()`` text
rendered by Textual, for the dark and the light theme, lines and dots of named and RGB colours, the
legend, and after a theme change (the shown plot is restyled at once, before its rebuild lands).
"""

from __future__ import annotations

import math
import threading
from dataclasses import replace

import pytest
from rich.style import Style as RichStyle
from rich.text import Text
from textual.app import App
from textual.content import Content
from textual.geometry import Region
from textual.strip import Strip
from textual.visual import Visual

from tpudash.runs.series import DecimatedSeries
from tpudash.tui import plotcells, plotlegend
from tpudash.tui.plots import MetricPlot, PlotLine
from tpudash.tui.plotwidget import plots_drawn


class PlotApp(App):
    def compose(self):
        yield MetricPlot("loss", id="plot")


def series(values: list[tuple[float, float]]) -> DecimatedSeries:
    kept = DecimatedSeries()
    kept.extend(values)
    return kept


def lines() -> list[PlotLine]:
    train = [(step, 2.0 * math.exp(-step / 50) + 0.1 * math.sin(step)) for step in range(300)]
    epochs = [(step, 2.0 * math.exp(-step / 50)) for step in range(0, 300, 40)]
    return [
        PlotLine("train", series(train), scatter=True),
        PlotLine("epoch", series(epochs), color="orange", markers=True),
        PlotLine("val", series([(step, value + 0.2) for step, value in epochs]), color=[200, 40, 220]),  # type: ignore[arg-type]  # RGB as a list: plotext makes it a tuple
    ]


def cells(strips: list[Strip]) -> list[list[tuple[str, RichStyle | None]]]:
    """Each line's cells as (character, style): the same picture compares equal however it is cut in segments."""
    return [[(char, segment.style) for segment in strip for char in segment.text] for strip in strips]


def plotext_own_text(plot: MetricPlot) -> list[Strip]:
    """plotext's own text of the figure the plot drew, rendered as Textual renders a widget's text."""
    ansi = plot.plt.build()  # the same figure, drawn again and written out as ANSI
    content = Content.from_rich_text(Text.from_ansi(ansi), console=plot.app.console)
    return Visual.to_strips(plot, content, plot.size.width, plot.size.height, plot.visual_style)


def shown(plot: MetricPlot) -> list[Strip]:
    return [plot.render_line(y) for y in range(plot.size.height)]


@pytest.mark.parametrize("theme", ["textual-dark", "textual-light"])
async def test_a_plot_drawn_from_plotexts_matrix_shows_every_cell_as_plotexts_text_does(theme):
    app = PlotApp()
    async with app.run_test(size=(72, 20)) as pilot:
        app.theme = theme
        plot = app.query_one(MetricPlot)
        plot.set_lines(lines())
        await plots_drawn(app.screen)
        await pilot.pause()
        drawn = shown(plot)
        assert "train" in plot.render().plain and "⠁" <= max(plot.render().plain) <= "⣿"  # braille dots, legend
        styles = {segment.style for strip in drawn for segment in strip}
        assert len(styles) >= 4  # the title, axes, three lines' colours: not one style painted over all
        assert cells(drawn) == cells(plotext_own_text(plot))
        # What the compositor paints is those lines.
        painted = plot.render_lines(Region(0, 0, plot.size.width, plot.size.height))
        assert [strip.text for strip in painted] == [strip.text for strip in drawn]


async def test_a_theme_change_restyles_the_plot_shown_before_its_rebuild_lands(monkeypatch):
    rebuild_may_land = threading.Event()
    build = plotcells.build_rows

    def held_build(*args):
        assert rebuild_may_land.wait(10), "the test never let the rebuild land"
        return build(*args)

    app = PlotApp()
    async with app.run_test(size=(72, 20)) as pilot:
        app.theme = "textual-dark"
        plot = app.query_one(MetricPlot)
        plot.set_lines(lines())
        await plots_drawn(app.screen)
        await pilot.pause()
        dark = cells(shown(plot))
        renders = plot.renders
        monkeypatch.setattr(plotcells, "build_rows", held_build)
        app.theme = "textual-light"
        await pilot.pause()  # the screen repaints in the new theme; the plot's rebuild is held
        assert plot.building and plot.renders == renders
        restyled = cells(shown(plot))
        assert restyled != dark and [char for char, _ in restyled[1]] == [char for char, _ in dark[1]]
        # The figure drawn before, on the widget's new look: as plotext's text of it is shown in that look.
        assert restyled == cells(plotext_own_text(plot))
        rebuild_may_land.set()
        await plots_drawn(app.screen)
        await pilot.pause()
        assert cells(shown(plot)) == cells(plotext_own_text(plot))


async def test_a_live_metric_plot_draws_its_lines_with_plotraster_as_plotext_alone_would(monkeypatch):
    """The run view's metric plot (noisy dots, a line, per-epoch markers, an RGB colour) takes plotext's
    costly part over (``tpudash.tui.plotraster``), keeps its frame while the data grow within its ticks, and
    every plot it shows is the one plotext alone draws."""
    # The run view's colours are names (or none: the theme's next); an RGB colour is a tuple. (plotext
    # reads a list as a colour per point: left to plotext, as the first test of this file shows.)
    metric_lines = [replace(line, color=(200, 40, 220)) if isinstance(line.color, list) else line for line in lines()]
    # The same run a few beats earlier: fewer steps, the same ticks (0 to 300).
    earlier = [
        replace(line, series=series([(x, y) for x, y in zip(*line.series.points()) if x < 290]))
        for line in metric_lines
    ]
    take_signals = plotlegend.take_signals
    taken: list[bool] = []

    def watched(monitor):
        signals = take_signals(monitor)
        if monitor.x:  # a figure with lines (not the empty one shown before the data came)
            taken.append(signals is not None)
        return signals

    shown_when: dict[str, list] = {}
    frames_reused = 0
    for drawer, take in (("plotraster", watched), ("plotext alone", lambda monitor: None)):
        monkeypatch.setattr(plotlegend, "take_signals", take)
        app = PlotApp()
        async with app.run_test(size=(100, 24)) as pilot:
            plot = app.query_one(MetricPlot)
            for beat, beat_lines in enumerate((earlier, metric_lines)):
                plot.set_lines(beat_lines)
                await plots_drawn(app.screen)
                await pilot.pause()
                shown_when[f"{drawer}, beat {beat}"] = cells(shown(plot))
            if drawer == "plotraster":
                frames_reused = plot._frames.reused
    assert taken and all(taken)
    assert frames_reused >= 1
    assert sum("⠁" <= char <= "⣿" for row in shown_when["plotraster, beat 1"] for char, _ in row) > 50
    assert shown_when["plotraster, beat 0"] != shown_when["plotraster, beat 1"]
    for beat in (0, 1):
        assert shown_when[f"plotraster, beat {beat}"] == shown_when[f"plotext alone, beat {beat}"]


async def test_a_plot_is_built_on_its_own_thread_and_a_build_that_fails_keeps_the_plot_shown(monkeypatch):
    build = plotcells.build_rows
    built_on: list[str] = []

    def noted_build(*args):
        built_on.append(threading.current_thread().name)
        return build(*args)

    def failing_build(*args):
        raise ValueError("plotext could not draw this")

    app = PlotApp()
    async with app.run_test(size=(72, 20)) as pilot:
        plot = app.query_one(MetricPlot)
        monkeypatch.setattr(plotcells, "build_rows", noted_build)
        plot.set_lines(lines())
        await plots_drawn(app.screen)
        await pilot.pause()
        assert built_on and all(name.startswith("tpudash-plot-build") for name in built_on)
        assert not app.workers  # no Textual worker: the UI thread's cost of one is more than the landing's
        before = [strip.text for strip in shown(plot)]
        monkeypatch.setattr(plotcells, "build_rows", failing_build)
        plot.set_lines(lines()[:1])
        await plots_drawn(app.screen)  # returns: the failed build is not asked for again and again
        await pilot.pause()
        assert plot.build_error == "ValueError: plotext could not draw this"
        assert app.is_running and [strip.text for strip in shown(plot)] == before  # the old text stays
        monkeypatch.setattr(plotcells, "build_rows", noted_build)
        plot.set_lines(lines()[:2])  # new data: built again
        await plots_drawn(app.screen)
        await pilot.pause()
        assert plot.build_error is None and [strip.text for strip in shown(plot)] != before


async def test_a_build_that_moves_some_rows_repaints_only_those_and_shows_the_whole_new_plot():
    app = PlotApp()
    async with app.run_test(size=(72, 20)) as pilot:
        plot = app.query_one(MetricPlot)
        plot.set_lines(lines())
        await plots_drawn(app.screen)
        await pilot.pause()
        before = cells(shown(plot))
        painted: list[int] = []
        render_line = plot.render_line

        def noted(y: int) -> Strip:
            painted.append(y)
            return render_line(y)

        plot.render_line = noted  # type: ignore[method-assign]
        moved = lines()
        moved[2] = PlotLine("val", series([(step, 1.6) for step in range(0, 300, 40)]), color="cyan")  # a flat line
        plot.set_lines(moved)
        await plots_drawn(app.screen)
        await pilot.pause()
        repainted = set(painted)
        plot.render_line = render_line  # type: ignore[method-assign]
        after = cells(shown(plot))
        changed = {y for y, (old, new) in enumerate(zip(before, after)) if old != new}
        assert changed and len(changed) < plot.size.height  # some rows moved, not all
        assert repainted == changed
        # What the screen shows is the whole new plot: every row as plotext draws the new figure.
        on_screen = app.screen._compositor.render_strips()
        top = plot.region.y
        assert [strip.text for strip in on_screen[top : top + plot.size.height]] == [
            strip.crop(0, plot.size.width).text for strip in plotext_own_text(plot)
        ]
        painted.clear()
        plot.render_line = noted  # type: ignore[method-assign]
        plot.set_lines(moved)  # the same lines again: a build that changes nothing repaints nothing
        await plots_drawn(app.screen)
        await pilot.pause()
        assert painted == []
