"""The dashboard watching the user's own training: a real ``model.fit`` with TpudashCallback in another process.

``tests.fit_process`` is a user's script: a small Keras model under an
8-replica MirroredStrategy, two fits, each holding after its first epoch
until told to go on. The dashboard notices the run within a second of its
start, ``w`` opens its live view, the loss plot grows as the file does, and
the run ends done; the second fit's process is killed with SIGKILL and its
run turns interrupted with everything it wrote kept.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from textual.widgets import DataTable, Static

from screens.history import HistoryScreen
from screens.run_detail import RunDetailScreen
from tests.functional.conftest import SIZE, until

REPO_ROOT = Path(__file__).resolve().parents[2]
# A TensorFlow import and two traced functions on a loaded 2-core machine.
FIT_TIMEOUT = 240.0


async def read_line(process: subprocess.Popen) -> str:
    return (await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), FIT_TIMEOUT)).strip()


def loss_points(screen: RunDetailScreen) -> int:
    plot = screen.view.plot_for("loss")
    return plot.points_drawn if plot is not None else 0


async def test_the_dashboard_watches_a_users_fit_live_then_done_and_a_killed_one_turns_interrupted(make_app):
    fit = subprocess.Popen(
        [sys.executable, "-m", "tests.fit_process"],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    app = make_app()
    try:
        async with app.run_test(size=SIZE) as pilot:
            # The run appears by itself, and the dashboard says so.
            await until(pilot, lambda: app.session.live_on_disk, timeout=FIT_TIMEOUT)
            assert [info.job for info in app.session.live_on_disk] == ["first-fit"]
            assert any("first-fit, from model.fit with TpudashCallback in pid" in text for _, _, text in app.notices)

            await pilot.press("w")
            detail = app.screen
            assert isinstance(detail, RunDetailScreen)
            await until(pilot, lambda: detail.loaded)
            assert "● live  written by model.fit with TpudashCallback" in str(
                detail.query_one("#detail-source", Static).content
            )
            assert await read_line(fit) == "epoch 1 of first-fit"
            # Everything of epoch 1 is on disk: the view shows it, drawn as the Run view draws.
            await until(
                pilot, lambda: detail.view.model.final_metrics.get("val_loss") is not None and loss_points(detail) >= 6
            )
            model = detail.view.model
            assert model.status == "running" and model.runtime["num_replicas"] == 8
            assert model.progress["epoch"].done == 1
            after_one_epoch = loss_points(detail)

            fit.stdin.write("go on\n")
            fit.stdin.flush()
            await until(pilot, lambda: detail.view.model.status == "done", timeout=FIT_TIMEOUT)
            await until(pilot, lambda: loss_points(detail) > after_one_epoch)  # it grew to the end
            assert model.progress["epoch"].done == 3 and model.final_metrics["val_accuracy"] > 0.8
            title = str(detail.view.query_one("#run-title", Static).content)
            assert "first-fit" in title and "✓ done" in title
            assert await read_line(fit) == "done first-fit"

            # The second fit: killed mid-run, without a word.
            assert await read_line(fit) == "epoch 1 of second-fit"
            await pilot.press("escape", "h")
            history = app.screen
            assert isinstance(history, HistoryScreen)
            table = history.query_one("#history-table", DataTable)

            def status_of(job: str) -> str | None:
                rows = [table.get_row_at(index) for index in range(table.row_count)]
                return next((str(row[3]) for row in rows if row[2] == job), None)

            await until(pilot, lambda: status_of("second-fit") == "● live", timeout=FIT_TIMEOUT)
            assert status_of("first-fit") == "✓ done"
            second = next(run_id for run_id, info in history.runs.items() if info.job == "second-fit")
            fit.kill()
            fit.wait(FIT_TIMEOUT)
            # No key pressed: the History screen hears of it on its own.
            await until(pilot, lambda: status_of("second-fit") == "! interrupted")
            table.move_cursor(row=[table.get_row_at(index)[2] for index in range(table.row_count)].index("second-fit"))
            await pilot.press("enter")
            killed = app.screen
            assert isinstance(killed, RunDetailScreen) and killed.run_id == second
            await until(pilot, lambda: killed.loaded and killed.view.model.status == "interrupted")
            assert killed.view.model.progress["epoch"].done == 1 and loss_points(killed) >= 6
            assert "ended without finishing; everything it wrote is kept" in str(
                killed.query_one("#detail-source", Static).content
            )
    finally:
        if fit.poll() is None:
            fit.kill()
        fit.wait(FIT_TIMEOUT)
