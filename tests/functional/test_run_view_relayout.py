"""A running run's new values repaint what shows them, and never lay the whole screen out again (issue 37).

Laying the screen out repaints every widget on it: while a job trains, every
CPU-second the dashboard spends is taken from the training beside it on a
small machine. Each epoch brings new per-replica values and the heartbeat
read rewrites the workers' line; when neither changes what is shown (the
Replicas tab's note, a single process's empty workers line), the screen
keeps its layout.
"""

from __future__ import annotations

from textual.screen import Screen

from jobs.events import Metric, Progress, ReplicaValues, RunStarted
from tests.functional.runview_harness import DEVICES, RunViewApp
from tpudash.runs.model import RunModel
from tpudash.tui.plots import plots_drawn
from tpudash.tui.runview import RunView


def epoch(model: RunModel, number: int) -> None:
    """One epoch of a training: its steps' losses, its progress and its per-replica values."""
    for step in range(number * 10, number * 10 + 10):
        model.apply(Metric("loss", 1.0 / (step + 1), step), 1.0)
        model.apply(Progress(step % 10 + 1, 10, "step"), 1.0)
    model.apply(Metric("loss", 1.0 / (number + 1), number, epoch=number, split="val"), 1.0)
    model.apply(Progress(number + 1, 5, "epoch"), 1.0)
    model.apply(ReplicaValues("val loss", [0.5 + index / 100 + number for index in range(8)], DEVICES), 1.0)


async def test_a_training_epoch_repaints_its_values_without_laying_the_screen_out_again(monkeypatch):
    model = RunModel()
    model.apply(RunStarted("20261128-051000-train-1a2b3c", "train", {}, {}, 1.0), 1.0)
    epoch(model, 0)
    layouts: list[Screen] = []
    lay_out = Screen._refresh_layout

    def counted(screen: Screen, *args, **kwargs):
        layouts.append(screen)
        return lay_out(screen, *args, **kwargs)

    monkeypatch.setattr(Screen, "_refresh_layout", counted)
    async with RunViewApp(model).run_test(size=(120, 40)) as pilot:
        view = pilot.app.query_one("#view", RunView)
        view.sync(force=True)
        await pilot.pause()
        await plots_drawn(pilot.app.screen)
        await pilot.pause()
        plot = view.plot_for("loss")
        assert plot is not None
        drawn_before = plot.drawn_series["train"][0][-1]
        layouts.clear()

        epoch(model, 1)
        view.show_workers([])  # the heartbeat read of a run of one process: no workers, as before
        view.sync(force=True)
        await pilot.pause()
        await plots_drawn(pilot.app.screen)
        await pilot.pause()

        assert plot.drawn_series["train"][0][-1] > drawn_before  # the new steps are on screen
        assert view.query_one("#run-progress").children[0].render_line(0).text.split("%")[1].strip().startswith("10/10")
        assert layouts == []
