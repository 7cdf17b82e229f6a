"""The run view's per-replica table and plots, as a user reads them (issue 38, items 13 and 17).

replica-matmul's products (``[[22, 28], [49, 64]]`` on each of 8 replicas) showed as ``prod…`` and
``[[22, 28], […`` with half the screen empty: they now show whole, a row per replica. Loss and
accuracy swapped sides between a job's run (loss first) and a Keras callback's (accuracy first):
loss is now left of accuracy in both.
"""

from __future__ import annotations

import pytest

from jobs.events import Metric, ReplicaValues, RunFinished, RunStarted
from tests.functional.runview_harness import DEVICES, RunViewApp
from tests.functional.test_app_80x24 import screen_rows
from tpudash.runs.model import RunModel
from tpudash.tui.plots import plots_drawn
from tpudash.tui.runview import RunView

PRODUCT = [[22.0, 28.0], [49.0, 64.0]]


def finished_run(job: str, events: list) -> RunModel:
    model = RunModel()
    for event in [RunStarted(f"20261117-102640-{job}-7a8b9c", job, {}, {}, 1.0), *events, RunFinished("done", {})]:
        model.apply(event, 1.0)
    return model


async def shown(pilot) -> RunView:
    view = pilot.app.query_one("#view", RunView)
    view.sync(force=True)
    await pilot.pause()
    await plots_drawn(pilot.app.screen)
    await pilot.pause()
    return view


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_replica_matmuls_products_are_whole_one_row_per_replica(size):
    model = finished_run(
        "replica-matmul",
        [ReplicaValues("product", [PRODUCT] * 8, DEVICES), ReplicaValues("max abs error", [0.0] * 8, DEVICES)],
    )
    async with RunViewApp(model).run_test(size=size) as pilot:
        view = await shown(pilot)
        assert view.query_one("#run-tabs").active == "tab-replicas"
        table = view.query_one("#replica-table").region
        rows = [row[table.x : table.right] for row in screen_rows(pilot.app)[table.y : table.bottom]]
        text = "\n".join(rows)
        assert "product" in rows[0] and "max abs error" in rows[0], text
        assert text.count("[[22, 28], [49, 64]]") == 8, text
        assert "…" not in text, text
        for index in range(8):
            assert any(f"replica {index}" in row for row in rows), text


def training_metrics(accuracy_first: bool) -> list:
    """Three epochs' loss and accuracy: a job reports loss first; Keras' logs (TpudashCallback) accuracy first."""
    events = []
    for step in range(30):
        loss = Metric("batch_loss", 2.3 * 0.95**step, step, epoch=step // 10)
        accuracy = Metric("batch_accuracy", 1 - 0.95**step, step, epoch=step // 10)
        events += [accuracy, loss] if accuracy_first else [loss, accuracy]
    return events


@pytest.mark.parametrize("accuracy_first", [False, True], ids=["job", "callback"])
@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_loss_is_left_of_accuracy_whichever_came_first(size, accuracy_first):
    model = finished_run("train", training_metrics(accuracy_first))
    async with RunViewApp(model).run_test(size=size) as pilot:
        view = await shown(pilot)
        loss, accuracy = view.plot_for("loss"), view.plot_for("accuracy")
        assert loss is not None and accuracy is not None
        assert loss.region.area and accuracy.region.area
        # Side by side, loss on the left; stacked (a short view), loss on top.
        assert (loss.region.y, loss.region.x) < (accuracy.region.y, accuracy.region.x)
        rows = screen_rows(pilot.app)
        loss_title = rows[loss.region.y][loss.region.x : loss.region.right]
        accuracy_title = rows[accuracy.region.y][accuracy.region.x : accuracy.region.right]
        assert loss_title.strip() == "loss" and accuracy_title.strip() == "accuracy", "\n".join(rows)
