"""The run view's stage line: what a run does before its steps report progress, live to the second.

A test job announces its stages (jobs.events.Stage) and is held by a gate
inside one, so the test sees the line as a user watching a slow start would.
The train job's own stages are checked in tests/unit/test_train.py.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from jobs.base import JobSpec
from jobs.events import Stage
from tests.functional.conftest import SIZE, JobGate, run_settled, runtime_ready, until

DATA = "making the data"


@pytest.fixture
def settings(settings):
    """No telemetry: a run's first sample shows its telemetry plot, a layout, which on a loaded machine may come
    late, inside the seconds in which the test counts the layouts the stage's clock makes (none)."""
    return replace(settings, telemetry_interval=0)


def staged_job(gate: JobGate) -> JobSpec:
    """Makes its data (held by ``gate`` at 3 of 10), builds a model, then takes one step."""

    def run(ctx, params):
        ctx.emit(Stage(DATA, 3, 10))
        gate.wait(ctx)
        ctx.emit(Stage(DATA, 10, 10))
        ctx.emit(Stage("building the model"))
        ctx.emit(Stage("training"))
        ctx.progress(1, 1, "step")
        return {}

    return JobSpec(
        name="test-stages", title="Test stages", description="A test job that reports its stages.", params=(), run=run
    )


def stage_seconds(text: str) -> float:
    """The clock of the stage under way in ``preparing: … · 1.0s  (…)``."""
    return float(re.search(r"· (\d+\.\d)s", text).group(1))


async def test_the_stage_under_way_shows_within_a_second_with_its_count_and_a_running_clock(
    make_app, test_specs, job_gate, screen_layouts
):
    gate = JobGate()
    job_gate.release.set()  # test-steps runs through
    test_specs["test-stages"] = staged_job(gate)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        # A job that reports no stages has no stage line.
        await run_settled(pilot, app.session.launch_by_name("test-steps", {"steps": "2"}))
        stage_line = app.screen.view.query_one("#run-stage")
        assert not stage_line.display
        try:
            live = app.session.launch_by_name("test-stages")
            await until(pilot, lambda: "preparing: making the data 3/10" in str(stage_line.render()))
            assert stage_line.display
            # Nothing new arrives while the job is held: the clock still moves, on the view's once-a-second redraw.
            first = stage_seconds(str(stage_line.render()))
            await until(pilot, lambda: stage_seconds(str(stage_line.render())) >= first + 1.0, timeout=10)
            # The clock is repainted in place: a layout would repaint the whole screen every second (issue 37).
            # A toast that expires lays its screen out too: test-steps' "done" toast must not expire in the
            # window, as it did on a loaded CI machine, 5 s after that run.
            app.clear_notifications()
            await pilot.pause()
            screen_layouts.clear()
            await until(pilot, lambda: stage_seconds(str(stage_line.render())) >= first + 2.0, timeout=10)
            await pilot.pause()
            assert screen_layouts == []
            assert stage_line.render_line(0).text.strip() == str(stage_line.render())
        finally:
            gate.release.set()
        await run_settled(pilot, live)
        text = str(stage_line.render())
        assert re.fullmatch(r"ready in \d+\.\ds: making the data \d+\.\ds · building the model \d+\.\ds", text), text
