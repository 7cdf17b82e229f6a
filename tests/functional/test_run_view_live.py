"""Live means live: a watched run's plots and its progress are drawn from the same read, on the same beat.

Issue 26, item 2: a ``tpudash.record`` loop showed progress 231 → 256 → 277 while the chart's last step read
216 → 255 → 276: a render budget held the plots back. Here a run is written step by step while its live view
is open; whenever the progress shows a step, the loss plot's text on screen shows that same step within the
beat after (plotext builds it in a thread: issue 26, item 1).
"""

from __future__ import annotations

import math

from jobs.events import Metric, Progress, RunFinished, RunStarted
from screens.run_detail import RunDetailScreen
from tests.functional.conftest import SIZE, until
from tpudash.format import display_beat

STEPS = 6


def shown_step(screen: RunDetailScreen) -> int | None:
    """The step the progress row shows (``5/6``), or None before it shows one."""
    rows = list(screen.view._progress_rows.values())
    text = str(rows[0].note) if rows else ""
    return int(text.split("/")[0]) if text else None


def plotted_step(screen: RunDetailScreen) -> float | None:
    """The last step of the loss plot's text on screen (None while the text shown is of older data)."""
    plot = screen.view.plot_for("loss")
    if plot is None or plot.shown is None or plot.shown.data_version != plot.data_version:
        return None
    drawn = plot.drawn_series.get("train")
    shown = plot.render().plain
    assert all(label in shown for label in plot.axis_ticks.get("x", [])), "the text shown is not the data plotted"
    return drawn[0][-1] if drawn and drawn[0] else None


async def plot_landed(screen: RunDetailScreen) -> int:
    """Wait for the loss plot's build in flight to land; how many display beats that took."""
    beat = display_beat()
    plot = screen.view.plot_for("loss")
    if plot is not None:
        await plot.drawn()
    return display_beat() - beat


async def test_each_step_the_progress_shows_is_the_last_step_the_plot_drew(make_app, store):
    recorder = store.create("20260101-000000-live-abc123", "live", {}, {}, source="record")
    recorder.record(RunStarted("20260101-000000-live-abc123", "live", {}, {}, 1.0))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = RunDetailScreen("20260101-000000-live-abc123")
        await app.push_screen(screen)
        await until(pilot, lambda: screen.loaded)
        for step in range(1, STEPS + 1):
            recorder.record(Metric("loss", 10.0 / step, step))
            recorder.record(Progress(step, STEPS, "step"))
            await until(pilot, lambda step=step: shown_step(screen) == step)
            assert await plot_landed(screen) <= 1, "the plot's text landed more than a beat after the progress"
            assert plotted_step(screen) == step, f"progress shows step {step}, the plot {plotted_step(screen)}"
        recorder.record(RunFinished("done", {}))
        await until(pilot, lambda: screen.view.model.status == "done")
        await plot_landed(screen)
        assert plotted_step(screen) == STEPS


async def test_the_step_axis_at_80_columns_reaches_the_last_step():
    from textual.app import App

    from tpudash.runs.series import DecimatedSeries
    from tpudash.tui.plots import MetricPlot, PlotLine

    class PlotApp(App):
        def compose(self):
            yield MetricPlot("loss", id="plot")

    series = DecimatedSeries()
    series.extend((step, 17.0 * 0.8**step) for step in range(25))
    async with PlotApp().run_test(size=(80, 24)) as pilot:
        plot = pilot.app.query_one("#plot", MetricPlot)
        plot.set_lines([PlotLine("train", series)])
        await pilot.pause()
        await plot.drawn()
        x_labels = plot.axis_ticks["x"]
        assert float(x_labels[-1]) >= 24 and float(x_labels[0]) <= 0
        drawn = plot.render().plain
        assert all(label in drawn for label in x_labels)


async def test_the_path_and_the_bars_get_even_ticks_that_cover_their_values_too():
    from textual.app import App

    from tpudash.runs.series import DecimatedSeries
    from tpudash.tui.plots import PathPlot, ReplicaBarPlot

    class PlotApp(App):
        def compose(self):
            yield PathPlot("path (x0, x1)", id="path")
            yield ReplicaBarPlot(id="bars")

    path = DecimatedSeries()
    path.extend((1.0 - step / 40, 4.0 * (1.0 - step / 40)) for step in range(41))
    async with PlotApp().run_test(size=(80, 48)) as pilot:
        path_plot = pilot.app.query_one("#path", PathPlot)
        bars = pilot.app.query_one("#bars", ReplicaBarPlot)
        path_plot.set_path(path)
        bars.set_values("GFLOP/s", [f"r{index}" for index in range(8)], [3.4 + index / 10 for index in range(8)])
        await pilot.pause()
        await path_plot.drawn()
        await bars.drawn()
        for plot, axis, top in ((path_plot, "x", 1.0), (path_plot, "y", 4.0), (bars, "y", 4.1)):
            ticks = [float(label) for label in plot.axis_ticks[axis]]
            steps = {round(b - a, 9) for a, b in zip(ticks, ticks[1:])}
            assert len(steps) == 1 and ticks[0] <= 0 and ticks[-1] >= top, (axis, ticks)
            (step,) = steps
            assert f"{step / 10 ** math.floor(math.log10(step)):.6g}" in ("1", "2", "5"), (axis, ticks)
            assert all(label in plot.render().plain for label in plot.axis_ticks[axis])
