"""The app shell: quit asks while a job runs, fd 2 goes to the session log, the palette, every screen at two sizes."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest
from textual.command import CommandList, CommandPalette
from textual.widgets import RichLog

from jobs.base import JobSpec
from screens.jobs import JobsScreen
from screens.run_detail import RunDetailScreen
from tests.functional.conftest import RUN_TIMEOUT, SIZE, press_to_quit, run_settled, runtime_ready, shown_live, until
from tpudash.runs.store import RunStore
from tpudash.tui.bars import KeyBar, SessionBar
from tpudash.tui.dialogs import ConfirmScreen
from tpudash.tui.plots import BudgetedPlot

REPO_ROOT = Path(__file__).resolve().parents[2]


async def test_quit_during_a_run_asks_then_records_the_run_as_cancelled(make_app, job_gate, isolated_runs_dir):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        live = app.session.launch_by_name("test-steps", {"steps": "1000"})
        await until(pilot, lambda: job_gate.reached.is_set())
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert not isinstance(app.screen, ConfirmScreen)
        assert live.model.status == "running" and app.is_running

        await pilot.press("q")
        await press_to_quit(pilot, "y")
        assert app.quit_worker.is_finished
    assert app.return_code == 0
    info = RunStore(isolated_runs_dir).info(isolated_runs_dir / live.run_id)
    assert info.status == "cancelled"
    assert info.final_metrics["batch_loss"] == 1 / 500


async def test_quit_without_a_job_exits_at_once(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await press_to_quit(pilot, "q")
    assert app.return_code == 0


def test_a_dashboards_own_process_freezes_what_it_built_at_start_and_gives_it_back_at_its_end(tmp_path):
    # run_app (the dashboard's own process) asks for it: a full collection then walks only what came after.
    # In a process of its own: freezing changes the whole process's collector, and this one makes app after app.
    import json
    import subprocess

    result = subprocess.run(
        [sys.executable, "-m", "tests.functional.frozen_session", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    counts = json.loads(result.stdout.splitlines()[-1])
    assert counts["frozen_once_settled"] > 0, "nothing was frozen once the screens were built"
    assert counts["frozen_after_the_end"] == 0, "the app's end left objects out of the collector's reach"


async def test_native_writes_to_fd2_go_to_the_session_log_and_fd2_comes_back(make_app, isolated_runs_dir):
    before = os.fstat(2)
    python_stderr = sys.stderr
    app = make_app(redirect_stderr=True)
    try:
        async with app.run_test(size=SIZE) as pilot:
            log_path = app.host_io.session_log.log_path
            assert log_path.parent == isolated_runs_dir / ".logs"
            os.write(2, b"I0000 native chatter from the C++ runtime\n")
            print("a Python warning printed by a library", file=sys.stderr)
            assert os.fstat(2).st_ino != before.st_ino
            await pilot.press("l")
            log = app.screen.query_one("#session-log", RichLog)
            await until(pilot, lambda: any("native chatter" in line.text for line in log.lines))
    finally:
        app.release_session_log()  # what run() does once the app has stopped drawing
    assert (os.fstat(2).st_ino, os.fstat(2).st_dev) == (before.st_ino, before.st_dev)
    assert sys.stderr is python_stderr
    assert "native chatter" in log_path.read_text()
    assert "a Python warning printed by a library" in log_path.read_text()


async def test_the_palette_offers_every_job_and_every_screen(make_app, test_specs):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await pilot.press("ctrl+p")
        assert isinstance(app.screen, CommandPalette)
        await until(pilot, lambda: app.screen.query_one(CommandList).option_count > 0)
        commands = app.screen.query_one(CommandList)
        prompts = [str(commands.get_option_at_index(i).prompt).split("\n")[0] for i in range(commands.option_count)]
        for name in test_specs:
            assert f"Run {name}" in prompts and f"Form: {name}" in prompts
        for screen_name in ("Devices", "Jobs", "Run view", "History", "Help", "Session log"):
            assert f"Show {screen_name}" in prompts
        assert any(prompt.startswith("Re-initialise the TPU") for prompt in prompts)
        await pilot.press(*"form gradient-descent")
        await until(
            pilot,
            lambda: (
                commands.option_count > 0
                and str(commands.get_option_at_index(0).prompt).startswith("Form: gradient-descent")
            ),
        )
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen))
        assert app.screen.current_form.spec.name == "gradient-descent"


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
async def test_every_screen_renders_at_small_and_large_sizes(make_app, job_gate, size):
    job_gate.release.set()
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await runtime_ready(pilot)
        await pilot.press("g")
        await run_settled(pilot, shown_live(app))
        await run_settled(pilot, app.session.launch_by_name("test-steps"))
        for key, mode in (
            ("d", "devices"),
            ("j", "jobs"),
            ("v", "run"),
            ("h", "history"),
            ("l", "log"),
            ("question_mark", "help"),
        ):
            await pilot.press(key)
            await pilot.pause()
            assert app.current_mode == mode
            bar = app.screen.query_one(SessionBar)
            assert bar.region.width == size[0] and "8 replicas" in str(bar.content)
        await pilot.press("h")
        await app.workers.wait_for_complete()
        await until(pilot, lambda: app.screen.query_one("#history-table").row_count == 2)
        await pilot.press("enter")
        assert isinstance(app.screen, RunDetailScreen)
        await app.workers.wait_for_complete()
        await until(pilot, lambda: app.screen.loaded)
        await pilot.press("escape", "v")
        for tab in ("tab-replicas", "tab-results", "tab-log", "tab-plots"):
            app.screen.view.query_one("#run-tabs").active = tab
            await pilot.pause()
        plots = list(app.screen.view.query(BudgetedPlot))
        assert plots and all(plot.points_drawn > 0 for plot in plots if plot.display and plot.id != "replica-plot")


async def test_resizing_during_a_run_keeps_the_plots(make_app, job_gate):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        live = app.session.launch_by_name("test-steps", {"steps": "40"})
        await until(pilot, lambda: job_gate.reached.is_set())
        view = app.screen.view
        await until(pilot, lambda: view.plot_for("loss") is not None and view.plot_for("loss").points_drawn >= 20)
        for width, height in ((80, 24), (200, 60), (120, 40)):
            await pilot.resize_terminal(width, height)
            await pilot.pause()
            plot = view.plot_for("loss")
            assert plot.size.width > 0 and plot.points_drawn >= 20
        job_gate.release.set()
        await run_settled(pilot, live)
        assert live.model.status == "done"


async def test_the_keys_line_shows_each_screens_keys_and_a_click_presses_one(make_app):
    app = make_app()
    async with app.run_test(size=(220, 40)) as pilot:
        await runtime_ready(pilot)
        keys_line = app.screen.query_one(KeyBar)
        devices_line = str(keys_line.render())
        assert "d Devices" in devices_line and "t Train" in devices_line and "q Quit" in devices_line
        assert "Mark" not in devices_line
        await pilot.press("h")
        history_line = str(app.screen.query_one(KeyBar).render())
        assert "space Mark" in history_line and "e Export CSV" in history_line
        # A click on " j Jobs " presses j.
        start = history_line.index(" j Jobs")
        await pilot.click(KeyBar, offset=(start + 2, 0))
        await until(pilot, lambda: app.current_mode == "jobs")
        # On the job list enter opens the form; in the form it launches.
        assert "⏎ Launch" not in str(app.screen.query_one(KeyBar).render())
        await pilot.press("enter")
        await until(pilot, lambda: "⏎ Launch" in str(app.screen.query_one(KeyBar).render()))


async def test_the_palette_key_stays_at_the_right_edge_on_a_narrow_terminal(make_app):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await runtime_ready(pilot)
        keys_line = app.screen.query_one(KeyBar)
        line = str(keys_line.render())
        assert len(line) == 80 and line.rstrip().endswith("^p")
        assert keys_line.spans[-1] == (78, 80, "ctrl+p")
        await pilot.click(KeyBar, offset=(78, 0))
        await until(pilot, lambda: isinstance(app.screen, CommandPalette))


def _slow_to_stop_job(may_stop: threading.Event) -> JobSpec:
    """Runs until cancelled, then takes until ``may_stop`` to wind down (a long step, a trace)."""

    def run(ctx, params):
        while not ctx.cancel_event.wait(0.05):
            pass
        may_stop.wait(RUN_TIMEOUT)
        ctx.raise_if_cancelled()
        return {}

    return JobSpec(
        name="test-slow-stop",
        title="Test slow stop",
        description="Winds down slowly when cancelled.",
        params=(),
        run=run,
    )


async def test_confirming_quit_during_a_run_shows_at_once_that_it_is_stopping(make_app, test_specs):
    may_stop = threading.Event()
    app = make_app(job_specs={**test_specs, "test-slow-stop": _slow_to_stop_job(may_stop)})
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await runtime_ready(pilot)
            live = app.session.launch_by_name("test-slow-stop")
            await until(pilot, lambda: live.model.status == "running")
            bar = app.screen.query_one(SessionBar)
            assert "test-slow-stop ● running" in str(bar.content)
            await pilot.press("q")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("y")
            # The job is still winding down and the app still up, and the header says so.
            await until(
                pilot,
                lambda: "stopping: cancelling test-slow-stop…" in str(app.screen.query_one(SessionBar).content),
                timeout=10,
            )
            assert app.is_running and not live.settled.is_set()
            assert "running" not in str(app.screen.query_one(SessionBar).content)
            may_stop.set()
            await app.quit_worker.wait()
    finally:
        may_stop.set()
    assert app.return_code == 0


async def test_no_collection_runs_between_a_screen_key_and_its_frame_and_it_runs_right_after(make_app):
    # The collector is made eager (a young collection every 50 allocations), so a screen switch would collect
    # many times over; none may run from the switch to the new screen's first frame, and it runs again after.
    import gc

    app = make_app()
    seen: list[str] = []

    def on_collection(phase: str, _info: dict) -> None:
        if phase == "start":
            seen.append("collection")

    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        display, switch_mode = app._display, app.switch_mode

        def drawn(screen, renderable) -> None:
            display(screen, renderable)
            if renderable is not None:
                seen.append(f"frame of {type(screen).__name__}")

        def switching(mode: str):
            seen.append(f"switch to {mode}")
            return switch_mode(mode)

        app._display, app.switch_mode = drawn, switching
        thresholds = gc.get_threshold()
        gc.callbacks.append(on_collection)
        gc.set_threshold(50, 10, 10)
        try:
            await pilot.press("j")
            await until(pilot, lambda: "frame of JobsScreen" in seen and seen[-1] == "collection")
        finally:
            gc.set_threshold(*thresholds)
            gc.callbacks.remove(on_collection)
        switched, framed = seen.index("switch to jobs"), seen.index("frame of JobsScreen")
        assert switched < framed and "collection" not in seen[switched:framed], seen[switched : framed + 1]
        assert gc.isenabled()
