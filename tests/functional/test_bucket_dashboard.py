"""The dashboard with its runs directory in a bucket: its own jobs go there through its real engine process.

``tpudash --runs-dir gs://…`` on a TPU VM: the engine (a child that owns
TensorFlow) writes each job's run into the bucket, the dashboard follows it
from there (on a thread of its own, so the keys never wait for the
network), and when the engine is killed mid-training the dashboard itself
writes the run's end into the bucket, keeping what it reported. The GCS
emulator runs in this process (tests/object_stores.py); the engine reaches it
through the environment it inherits.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.functional.conftest import SIZE, run_settled, runtime_ready, until
from tests.functional.test_app_engine import LONG_SYNTHETIC_TRAIN
from tests.functional.test_app_engine import SEED_FIGURE as GRADIENT_DESCENT_FIGURE
from tpudash.config import Settings
from tpudash.runs.store import RunStore
from tpudash.tui.app import TpudashApp

# A whole-process end-to-end test: CI runs it after the default suite (pytest -m slow).
pytestmark = pytest.mark.slow

pytest_plugins = ["tests.object_stores"]  # gcs_store: a loopback GCS emulator


async def test_the_dashboards_jobs_land_in_the_bucket_and_a_killed_engines_run_is_ended_there(gcs_store, tmp_path):
    runs_url = gcs_store.url("tpudash/runs")
    settings = Settings(cpu_devices=8, runs_dir=runs_url, data_dir=tmp_path / "tfds", telemetry_interval=0)
    app = TpudashApp(settings)
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        descent = app.session.launch_by_name("gradient-descent")
        await run_settled(pilot, descent)
        assert descent.model.status == "done"
        assert descent.model.summary["line"] == GRADIENT_DESCENT_FIGURE

        training = app.session.launch_by_name("train", LONG_SYNTHETIC_TRAIN)
        # The first steps reach the dashboard through the bucket (a segment every 2 s).
        await until(pilot, lambda: "step" in training.model.progress, timeout=180)
        os.kill(app.session.lane.engine.pid, signal.SIGKILL)
        await run_settled(pilot, training)
        assert training.model.status == "failed" and "SIGKILL" in training.model.error

    store = RunStore(runs_url)
    runs = {info.run_id: info for info in store.list_runs()}
    assert runs[descent.run_id].status == "done" and runs[descent.run_id].path == f"{runs_url}/{descent.run_id}"
    killed = runs[training.run_id]
    assert killed.status == "failed" and "SIGKILL" in (killed.error or "")
    assert "batch_loss" in killed.final_metrics  # what it reported before the engine died is kept
    events = store.load(training.run_id).events
    assert [event.type for _, event in events].count("run_finished") == 1
