"""Long histories: a run view fed hundreds of thousands of points stays bounded and keeps what matters."""

from __future__ import annotations

from textual.app import App

from jobs.events import Metric
from tpudash.runs.model import RunModel
from tpudash.runs.series import DEFAULT_SERIES_CAPACITY
from tpudash.tui.plots import MetricPlot
from tpudash.tui.runview import plot_lines

POINTS = 200_000
SPIKE_STEP = 131_072  # 2**17: on the grid of every power-of-two stride the reservoir uses


class PlotApp(App):
    def compose(self):
        yield MetricPlot("loss", id="plot")


async def test_a_long_history_draws_about_one_point_per_column_and_keeps_spikes_and_the_end():
    model = RunModel(job="long", status="running")
    for step in range(POINTS):
        value = 50.0 if step == SPIKE_STEP else 1.0 / (1 + step / 1000)
        model.apply(Metric("batch_loss", value, step, epoch=0), 0.0)
    track = model.tracks[("loss", "train", "batch")]
    assert track.count == POINTS
    assert len(track.series) <= DEFAULT_SERIES_CAPACITY and len(track.smoothed) <= DEFAULT_SERIES_CAPACITY

    app = PlotApp()
    async with app.run_test(size=(100, 30)) as pilot:
        plot = app.query_one("#plot", MetricPlot)
        plot.set_lines([line for line in plot_lines(model.families["loss"]) if line.label == "train (batch)"])
        await pilot.pause()
        assert 0 < plot.points_drawn <= 2 * plot.size.width
        xs, ys = plot.drawn_series["train (batch)"]
        assert xs[0] == 0 and xs[-1] == POINTS - 1
        assert 50.0 in ys  # one bad batch among 200,000 is still visible
