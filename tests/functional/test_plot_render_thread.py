"""Plots are built off the UI thread (issue 26, item 1: "every key answers within a frame").

plotext turns a plot's data into text in pure Python: about 10 ms for a 5,000-point series at 160×24, and
tens of ms on a loaded machine. Built in ``render()``, that time was the UI thread's, and a key pressed
meanwhile waited for it. Here plotext's build is held at a gate, as a slow machine would hold it, and the
dashboard must still answer keys; a build whose data went stale while it ran is dropped for the newest.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from textual.app import App
from textual.widgets import Label

from tpudash.runs.series import DecimatedSeries
from tpudash.tui.plotlegend import DecoratedFigure
from tpudash.tui.plots import MetricPlot, PlotLine

GATE_SECONDS = 10.0  # bounded: a build held on the UI thread (the bug) ends, and the test says why it failed


class BuildGate:
    """Once armed, holds each plotext build until the test releases it; counts builds and how many ran at once."""

    def __init__(self):
        self.armed = False
        self.entered: list[threading.Event] = [threading.Event() for _ in range(8)]
        self.release: list[threading.Event] = [threading.Event() for _ in range(8)]
        self.finished: list[threading.Event] = [threading.Event() for _ in range(8)]
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.running = 0
        self.most_at_once = 0

    def wrap(self, original):
        def build(figure):
            if not self.armed:
                return original(figure)
            with self._lock:
                index = len(self.threads)
                self.threads.append(threading.current_thread())
                self.running += 1
                self.most_at_once = max(self.most_at_once, self.running)
            self.entered[index].set()
            self.release[index].wait(GATE_SECONDS)
            try:
                return original(figure)
            finally:
                with self._lock:
                    self.running -= 1
                self.finished[index].set()

        return build


@pytest.fixture
def gate(monkeypatch) -> BuildGate:
    gate = BuildGate()
    monkeypatch.setattr(DecoratedFigure, "_build_matrix", gate.wrap(DecoratedFigure._build_matrix))
    yield gate
    for event in gate.release:
        event.set()


class PlotApp(App):
    BINDINGS = [("x", "mark", "mark")]

    def compose(self):
        yield Label("", id="mark")
        yield MetricPlot("loss", id="plot")

    def action_mark(self) -> None:
        self.query_one("#mark", Label).update("key answered")


async def started(pilot, gate: BuildGate) -> MetricPlot:
    """The app's plot, its first (empty, "waiting for data") text drawn, and the gate armed."""
    plot = pilot.app.query_one("#plot", MetricPlot)
    await pilot.pause()
    await plot.drawn()
    assert "waiting for data" in plot.render().plain
    gate.armed = True
    return plot


def steps_series(last: int) -> DecimatedSeries:
    series = DecimatedSeries()
    series.extend((step, 10.0 / (step + 1)) for step in range(last + 1))
    return series


async def entered(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, GATE_SECONDS), "plotext's build never started"


async def test_a_key_answers_while_a_plot_is_being_built(gate):
    app = PlotApp()
    async with app.run_test(size=(100, 30)) as pilot:
        plot = await started(pilot, gate)
        plot.set_lines([PlotLine("train", steps_series(24))])
        await entered(gate.entered[0])
        await pilot.press("x")
        await pilot.pause()
        assert str(app.query_one("#mark", Label).content) == "key answered"
        assert not gate.finished[0].is_set(), "the key waited for the plot's build: it ran on the UI thread"
        assert gate.threads[0] is not threading.main_thread()

        gate.release[0].set()
        await plot.drawn()
        shown = plot.render().plain
        assert "loss" in shown and float(plot.axis_ticks["x"][-1]) >= 24  # the title; the axis reaches the last step
        assert all(label in shown for label in plot.axis_ticks["x"])


async def test_a_build_whose_data_went_stale_is_dropped_for_the_newest(gate):
    app = PlotApp()
    async with app.run_test(size=(100, 30)) as pilot:
        plot = await started(pilot, gate)
        plot.set_lines([PlotLine("train", steps_series(10))])
        await entered(gate.entered[0])
        plot.set_lines([PlotLine("train", steps_series(1000))])  # newer data while the first build runs
        await pilot.pause()
        assert len(gate.threads) == 1, "a second build of the same plot started while one was in flight"

        gate.release[0].set()
        await entered(gate.entered[1])  # the stale build came back and another was asked for
        shown = plot.render().plain
        assert "waiting for data" in shown and "10" not in shown.split()  # the stale text never reached the screen

        gate.release[1].set()
        await plot.drawn()
        x_axis = plot.axis_ticks["x"]
        assert x_axis[-1] == "1000"
        assert all(label in plot.render().plain for label in x_axis)
        assert gate.most_at_once == 1 and len(gate.threads) == 2


async def test_a_plot_on_show_is_painted_once_per_update_when_its_build_lands(gate):
    # A plot that repainted its old text on new data as well, every second while a job trains, took a third of the
    # dashboard's UI time (when painting turned the whole text into strips; it is cheaper now, not free).
    app = PlotApp()
    async with app.run_test(size=(100, 30)) as pilot:
        plot = await started(pilot, gate)
        painted: list[int] = []
        render_lines = plot.render_lines
        plot.render_lines = lambda crop: painted.append(plot.data_version) or render_lines(crop)  # type: ignore[method-assign]
        plot.set_lines([PlotLine("train", steps_series(24))])
        await entered(gate.entered[0])
        await pilot.pause()
        assert painted == [], "the plot painted its old text again while the new one was being built"

        gate.release[0].set()
        await plot.drawn()
        await pilot.pause()
        assert painted == [plot.data_version]
        assert float(plot.axis_ticks["x"][-1]) >= 24  # the new data is what was painted
