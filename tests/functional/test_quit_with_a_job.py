"""Quit while a job runs (issue 26): q, y; the run is kept as cancelled and the engine process is gone.

The engine is a real process (``python -m tests.engine_main``, the suite's
jobs added). The quit worker cancels the run, waits for its end on disk,
releases the engine and exits: whatever the quit saves in time, nothing the
user ran is lost and nothing is left running.
"""

from __future__ import annotations

import subprocess

import pytest

from jobs import registry
from tests.engine_jobs import SPECS as TEST_ENGINE_JOBS
from tests.engine_main import ENGINE_MAIN
from tests.functional.conftest import SIZE, press_to_quit, runtime_ready, until
from tpudash.engine.handle import EngineProcess
from tpudash.runs.store import RunStore
from tpudash.tui.app import TpudashApp

# A whole-process end-to-end test: CI runs it after the default suite (pytest -m slow).
pytestmark = pytest.mark.slow

TRAINING = {"source": "synthetic", "epochs": "50", "batch_per_replica": "8", "limit_train": "2048", "limit_test": "128"}
ENGINE_EXIT_TIMEOUT = 30.0


async def test_quit_while_training_records_the_run_as_cancelled_and_ends_the_engine(settings, tmp_path):
    specs = dict(registry()) | {spec.name: spec for spec in TEST_ENGINE_JOBS}
    engines: list[EngineProcess] = []

    exiting_when_released: list[bool] = []

    def start_engine(listener):
        engine = EngineProcess(listener, settings, tmp_path / "engine.log", module=ENGINE_MAIN)
        release = engine.release

        def noted_release() -> None:
            exiting_when_released.append(app.exiting)
            release()

        engine.release = noted_release  # type: ignore[method-assign]
        engines.append(engine)
        return engine

    app = TpudashApp(settings, job_specs=specs, engine_factory=start_engine)
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        training = app.session.launch_by_name("train", TRAINING)
        await until(pilot, lambda: "step" in training.model.progress, timeout=180)
        await pilot.press("q")
        assert "train is running" in app.screen.question
        await press_to_quit(pilot, "y", timeout=ENGINE_EXIT_TIMEOUT)
    # Released by the quit itself, before the app began to close its screens: not left to the app's unmount.
    assert exiting_when_released[:1] == [False]
    assert app.return_code == 0
    info = RunStore(settings.runs_dir).info(settings.runs_dir / training.run_id)
    assert info.status == "cancelled"
    assert "batch_loss" in info.final_metrics  # what it reported before the quit is kept
    try:
        engines[0]._process.wait(timeout=ENGINE_EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the engine (pid {engines[0].pid}) is still running after the dashboard quit") from None
    assert len(engines) == 1
