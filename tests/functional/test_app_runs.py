"""The live run view: updates while a job runs, cancel, a failing job, the queue."""

from __future__ import annotations

from textual.widgets import OptionList, RichLog, Static, TabbedContent

from screens.run import RunScreen
from tests.functional.conftest import SIZE, run_settled, runtime_ready, shown_live, until
from tpudash.runs.store import RunStore


async def test_the_loss_plot_updates_while_a_job_runs_and_ends_with_val_metrics(make_app, job_gate):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        live = app.session.launch_by_name("test-steps", {"steps": "40"})
        await until(pilot, lambda: job_gate.reached.is_set() and live.model.events_seen >= 20)
        view = app.screen.view
        assert isinstance(app.screen, RunScreen) and view.model is live.model
        # Held half way: the plot already draws the first 20 losses while the run is running.
        await until(pilot, lambda: view.plot_for("loss") is not None and view.plot_for("loss").points_drawn >= 20)
        assert live.model.status == "running"
        assert "running" in app.lane_status and "test-steps" in app.lane_status
        # The bar moves at most twice a second; it gets there.
        await until(pilot, lambda: "step" in view._progress_rows and view._progress_rows["step"].done == 20)
        assert view._progress_rows["step"].total == 40
        job_gate.release.set()
        await run_settled(pilot, live)
        assert live.model.status == "done"
        assert live.model.last_metrics()["val_loss"] == 1 / 40
        plot = view.plot_for("loss")
        assert [line.label for line in plot.lines] == ["train (batch)", "train (smoothed)", "val (epoch)"]
        assert plot.points_drawn > 40


async def test_c_cancels_the_running_job_and_the_lane_takes_the_next(make_app, job_gate, isolated_runs_dir):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        live = app.session.launch_by_name("test-steps", {"steps": "1000"})
        queued = app.session.launch_by_name("gradient-descent")
        await until(pilot, lambda: job_gate.reached.is_set())
        assert queued.model.status == "queued" and queued.queue_position == 1
        lane = app.screen.query_one("#lane-list", OptionList)
        assert "(#1)" in str(lane.get_option_at_index(0).prompt)
        await pilot.press("c")
        await run_settled(pilot, live)
        assert live.model.status == "cancelled"
        assert RunStore(isolated_runs_dir).info(isolated_runs_dir / live.run_id).status == "cancelled"
        await run_settled(pilot, queued)
        assert queued.model.status == "done"


async def test_a_job_that_raises_shows_its_error_and_the_app_keeps_working(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        live = app.session.launch_by_name("test-fails")
        await run_settled(pilot, live)
        view = app.screen.view
        assert live.model.status == "failed"
        assert "ValueError: deliberate failure for the test" in str(view.query_one("#run-error", Static).content)
        assert view.query_one("#run-error", Static).display
        assert any(severity == "error" and "deliberate failure" in message for _, severity, message in app.notices)
        tabs = view.query_one("#run-tabs", TabbedContent)
        assert tabs.active == "tab-log"
        await pilot.pause()
        log_lines = "\n".join(line.text for line in view.query_one("#run-log", RichLog).lines)
        assert "about to fail" in log_lines and "Traceback" in log_lines and "raise ValueError" in log_lines
        # Still answering keys, and the next job runs.
        await pilot.press("d")
        assert app.current_mode == "devices"
        await pilot.press("g")
        await run_settled(pilot, shown_live(app))
        assert shown_live(app).model.status == "done"


async def test_x_on_a_queued_run_removes_it_without_running_it(make_app, job_gate, isolated_runs_dir):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        running = app.session.launch_by_name("test-steps", {"steps": "100"})
        queued = app.session.launch_by_name("gradient-descent")
        await until(pilot, lambda: job_gate.reached.is_set())
        assert app.shown_run_id == queued.run_id and queued.model.status == "queued"
        await pilot.press("x")
        await run_settled(pilot, queued)
        assert queued.model.status == "cancelled" and queued.model.started is None
        assert running.model.status == "running"
        job_gate.release.set()
        await run_settled(pilot, running)
        assert running.model.status == "done"
        assert sorted(path.name for path in isolated_runs_dir.iterdir() if not path.name.startswith(".")) == [
            running.run_id
        ]


async def test_an_unreadable_runs_directory_is_said_once_while_the_scans_go_on(make_app, monkeypatch):
    from tpudash.runs.follow import RunsDirectoryWatch

    scans = []

    def refuse(self):
        scans.append(1)
        raise PermissionError(13, "Permission denied", str(self.store.root))

    monkeypatch.setattr(RunsDirectoryWatch, "scan", refuse)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await until(pilot, lambda: len(scans) >= 3)
        said = [text for _, severity, text in app.notices if text.startswith("Cannot read the runs directory")]
        assert said == [
            f"Cannot read the runs directory: PermissionError: [Errno 13] Permission denied: '{app.session.store.root}'"
        ]
        assert app.is_running  # the dashboard goes on
