"""A plot's legend hides none of its data, its y label sits on the y axis, and one value reads round
(issue 38, item 14: the loss curve's first part, 2.3 → 1.0, hid under the legend; the gradient-descent
path's ``x1`` sat at the bottom left; examples/s ticks read ``58.5 87.8 117.0`` and ``7987.2``; the
telemetry axis ``0.0071…0.0212``)."""

from __future__ import annotations

import dataclasses

import pytest
from textual.app import App
from textual.containers import Vertical

from jobs.events import Metric
from tests.functional.test_app_80x24 import screen_rows
from tpudash.runs.model import RunModel
from tpudash.runs.series import DecimatedSeries
from tpudash.tui.plots import BudgetedPlot, MetricPlot, PathPlot, PlotLine, plots_drawn
from tpudash.tui.runview import plot_lines

# The braille cells and markers plotext draws data with (the legend's labels are letters).
DATA_CHARACTERS = {chr(code) for code in range(0x2801, 0x2900)} | {"●", "o", "x"}


def training_loss_and_accuracy() -> RunModel:
    """Three epochs of a falling loss and a rising accuracy, as the train job reports them."""
    model = RunModel(job="train", status="running")
    for epoch in range(3):
        for batch in range(30):
            step = epoch * 30 + batch
            loss = 2.3 * 0.97**step + 0.05 * ((step * 7) % 5) / 5
            model.apply(Metric("batch_loss", loss, step, epoch=epoch), 0.0)
            model.apply(Metric("batch_accuracy", 1 - loss / 2.5, step, epoch=epoch), 0.0)
        end = (epoch + 1) * 30
        model.apply(Metric("loss", 2.3 * 0.97**end, end, epoch=epoch), 0.0)
        model.apply(Metric("loss", 2.3 * 0.97**end + 0.04, end, epoch=epoch, split="val"), 0.0)
        model.apply(Metric("accuracy", 1 - 0.97**end, end, epoch=epoch), 0.0)
    return model


class TwoPlots(App):
    """The same lines twice, one above the other: with their legend, and without (label None)."""

    CSS = "MetricPlot { height: 1fr; }"

    def __init__(self, lines: list[PlotLine]):
        super().__init__()
        self.lines = lines

    def compose(self):
        with Vertical():
            yield MetricPlot("metric", id="with-legend")
            yield MetricPlot("metric", id="without-legend")

    def on_mount(self) -> None:
        self.query_one("#with-legend", MetricPlot).set_lines(self.lines)
        unlabelled = [dataclasses.replace(line, label=None) for line in self.lines]
        self.query_one("#without-legend", MetricPlot).set_lines(unlabelled)


def plot_rows(app, plot: BudgetedPlot) -> list[str]:
    region = plot.region
    return [row[region.x : region.right] for row in screen_rows(app)[region.y : region.bottom]]


async def drawn(pilot) -> None:
    await pilot.pause()
    await plots_drawn(pilot.app.screen)
    await pilot.pause()


@pytest.mark.parametrize("family", ["loss", "accuracy"])
@pytest.mark.parametrize("size", [(80, 30), (160, 96)])
async def test_the_legend_hides_no_data_and_is_whole(family, size):
    lines = plot_lines(training_loss_and_accuracy().families[family])
    app = TwoPlots(lines)
    async with app.run_test(size=size) as pilot:
        await drawn(pilot)
        with_legend = plot_rows(app, app.query_one("#with-legend", BudgetedPlot))
        without = plot_rows(app, app.query_one("#without-legend", BudgetedPlot))
        assert len(with_legend) == len(without)
        hidden = [
            (row, column, data, with_legend[row][column])
            for row, line in enumerate(without)
            for column, data in enumerate(line)
            if data in DATA_CHARACTERS and with_legend[row][column] != data
        ]
        assert not hidden, "\n".join(with_legend)
        text = "\n".join(with_legend)
        assert all(line.label in text for line in lines), text


class OnePlot(App):
    def __init__(self, plot: BudgetedPlot):
        super().__init__()
        self.plot = plot

    def compose(self):
        yield self.plot


async def test_the_paths_y_label_sits_above_its_y_axis_not_under_the_x_axis():
    path = DecimatedSeries()
    path.extend((0.8**step, 4 * 0.8**step) for step in range(20))
    plot = PathPlot("path (x0, x1)", id="path")
    async with OnePlot(plot).run_test(size=(80, 24)) as pilot:
        plot.set_path(path)
        await drawn(pilot)
        rows = plot_rows(pilot.app, plot)
        assert rows[0].startswith("x1"), "\n".join(rows)  # the title's row, at the left: over the y ticks
        assert "x1" not in rows[-1] and rows[-1].strip() == "x0", "\n".join(rows)


def one_point(value: float, x: float) -> list[PlotLine]:
    series = DecimatedSeries()
    series.append(x, value)
    return [PlotLine("train (epoch)", series, color="red", markers=True)]


@pytest.mark.parametrize(("value", "ticks"), [(7987.2, ["0", "2000", "4000", "6000", "8000"]), (87.8, None)])
async def test_one_epochs_examples_per_second_reads_round_ticks(value, ticks):
    plot = MetricPlot("examples_per_second", id="rate")
    async with OnePlot(plot).run_test(size=(60, 16)) as pilot:
        plot.set_lines(one_point(value, 30))
        await drawn(pilot)
        text = "\n".join(plot_rows(pilot.app, plot))
        labels = plot.axis_ticks.get("y")
        assert labels, text
        assert all(label.isdigit() for label in labels) and labels[0] == "0" and float(labels[-1]) >= value, text
        steps = {int(b) - int(a) for a, b in zip(labels, labels[1:])}
        assert len(steps) == 1 and str(steps.pop()).lstrip("0")[:1] in "125", labels
        assert ticks is None or labels == ticks
        for plotexts in ("58.5", "117.0", "7987.2", "3993.6"):
            assert plotexts not in text, text


async def test_one_telemetry_sample_reads_whole_seconds():
    # As the run view's telemetry plot: percentages against seconds since the run started.
    plot = MetricPlot(
        "accelerator and host (%)", xlabel="seconds since the run started", y_range=(0, 100), id="telemetry"
    )
    async with OnePlot(plot).run_test(size=(80, 14)) as pilot:
        plot.set_lines(one_point(42.0, 0.01414))
        await drawn(pilot)
        text = "\n".join(plot_rows(pilot.app, plot))
        assert plot.axis_ticks.get("x") == ["0", "1"], text
        assert "0.0071" not in text and "0.0212" not in text, text
