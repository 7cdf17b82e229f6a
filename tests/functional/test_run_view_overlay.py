"""The overlay names a run's held-out data once (issue 26, 5.11: the legend read ``train 92805b train/val/test``)."""

from __future__ import annotations

from jobs.events import Metric
from screens.overlay import HELD_OUT_LABEL, loss_series
from tpudash.runs.model import RunModel


def test_val_each_epoch_and_test_at_the_end_are_one_held_out_line():
    model = RunModel(job="train", status="running")
    for step in range(1, 31):
        model.apply(Metric("batch_loss", 1.0 / step, step, epoch=(step - 1) // 10), 0.0)
        if step % 10 == 0:
            model.apply(Metric("loss", 2.0 / step, step, epoch=step // 10, split="val"), 0.0)
    model.apply(Metric("loss", 0.05, 30, epoch=3, split="test"), 0.0)  # the same data, evaluated at the end
    model.apply(Metric("loss", 0.04, 31, epoch=3, split="test"), 0.0)

    lines = loss_series(model)

    assert [label for label, _ in lines] == ["train", HELD_OUT_LABEL]
    xs, ys = lines[1][1].points()
    # The val points, then the test point past them; at step 30 both exist and the val point is kept.
    assert xs == [10, 20, 30, 31] and ys == [0.2, 0.1, 2.0 / 30, 0.04]


def test_a_finished_run_without_metrics_never_says_yet_and_names_what_it_has():
    from jobs.events import RunFinished, Table
    from tpudash.tui.runview import plots_note

    model = RunModel(job="matmul", status="running")
    assert "yet" in plots_note(model)
    model.apply(Table("per device", ["device", "GFLOP/s"], [["cpu:0", 1.0]]), 0.0)
    model.apply(RunFinished("done", {"gflops": {"cpu:0": 1.0}}), 1.0)
    note = plots_note(model)
    assert "yet" not in note
    assert note == "matmul reported no metrics to plot; it has its table (per device) under Results."
