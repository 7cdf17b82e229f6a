"""The engine process may die; the dashboard may not.

A real engine process (``python -m tpudash.engine``) under a Pilot session:
kill -9 mid-training, then a job that aborts its process on purpose. After
each, the run is recorded as failed with the signal (and the engine's last
stderr lines), the dashboard answers keys, and the next launch starts a new
engine that runs the next job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from jobs import registry
from screens.jobs import JobsScreen
from tests.conftest import REPO_ROOT
from tests.engine_jobs import ABORT_LINE
from tests.engine_jobs import SPECS as TEST_ENGINE_JOBS
from tests.engine_main import ENGINE_MAIN
from tests.functional.conftest import SIZE, run_settled, runtime_ready, until
from tpudash.engine.handle import EngineProcess
from tpudash.runs.store import RunStore
from tpudash.tui.app import TpudashApp

# A whole-process end-to-end test: CI runs it after the default suite (pytest -m slow).
pytestmark = pytest.mark.slow

SEED_FIGURE = "0.0022596875205636024 @ [0.01152921 0.04611686]"
LONG_SYNTHETIC_TRAIN = {
    "source": "synthetic",
    "epochs": "50",
    "batch_per_replica": "8",
    "limit_train": "2048",
    "limit_test": "128",
}


async def test_the_dashboard_survives_its_engine_killed_mid_training_and_aborting_and_the_next_job_runs(
    settings, tmp_path
):
    specs = dict(registry()) | {spec.name: spec for spec in TEST_ENGINE_JOBS}
    # The engine process as users get it, plus the test suite's jobs (``python -m tests.engine_main``).
    app = TpudashApp(
        settings,
        job_specs=specs,
        engine_factory=lambda listener: EngineProcess(listener, settings, tmp_path / "engine.log", module=ENGINE_MAIN),
    )
    store = RunStore(settings.runs_dir)
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        assert app.engine_status == "ready on CPU" and app.runtime.description.num_replicas == 8
        first_engine = app.session.lane.engine.pid
        assert first_engine != os.getpid()
        # Training there must not take the keys' CPU: the kernel runs the engine on what the dashboard leaves.
        assert settings.engine_nice == "idle"
        assert os.sched_getscheduler(first_engine) == os.SCHED_IDLE

        training = app.session.launch_by_name("train", LONG_SYNTHETIC_TRAIN)
        await until(pilot, lambda: "step" in training.model.progress, timeout=180)
        os.kill(first_engine, signal.SIGKILL)
        await run_settled(pilot, training)
        assert training.model.status == "failed"
        assert "killed by SIGKILL while running train" in training.model.error
        info = store.info(store.root / training.run_id)
        assert info.status == "failed" and "SIGKILL" in info.error
        assert "batch_loss" in info.final_metrics  # what it reported before dying is kept
        assert app.engine_status == "crashed (SIGKILL)"
        assert any("Engine crashed" in message for _, _, message in app.notices)

        await pilot.press("j")
        assert isinstance(app.screen, JobsScreen)

        aborting = app.session.launch_by_name("test-abort")
        await run_settled(pilot, aborting)
        assert aborting.model.status == "failed"
        assert "killed by SIGABRT while running test-abort" in aborting.model.error
        assert ABORT_LINE in aborting.model.error  # the engine's last stderr lines
        assert app.session.lane.engine_starts == 2

        await pilot.press("g")
        descent = app.session.live_runs[app.shown_run_id]
        await run_settled(pilot, descent)
        assert descent.model.status == "done" and descent.model.outcome_line() == SEED_FIGURE
        assert app.session.lane.engine_starts == 3 and app.engine_status == "ready on CPU"
        assert app._exception is None


def test_a_session_that_opens_devices_runs_every_job_and_cancels_one_never_imports_tensorflow(isolated_runs_dir):
    from tests.unit.test_cli import USER_UNSET

    environment = {name: value for name, value in os.environ.items() if name not in USER_UNSET}
    environment["TPUDASH_RUNS_DIR"] = str(isolated_runs_dir)
    result = subprocess.run(
        [sys.executable, "-m", "tests.functional.tf_free_session"],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    session = json.loads(result.stdout.strip().splitlines()[-1])
    assert session["statuses"] == {name: "done" for name in registry()} | {"train (cancelled mid-run)": "cancelled"}
    assert session["engine_pid"] != session["pid"] and session["engine_starts"] == 1  # one warm engine
    assert session["tensorflow"] is False and session["keras"] is False
