"""A user's Keras script started twice, as chief and as worker (TF_CONFIG), with TpudashCallback: one run.

Two TensorFlow processes; the default strategy (Keras 3's fit under
MultiWorkerMirroredStrategy is broken upstream), so what is tested is how the
callback finds its worker and how the two write one run.
"""

from __future__ import annotations

import os

from jobs.events import Metric, RunFinished
from tests.cluster.user_script import run_two_workers
from tpudash.runs.store import RunStore
from tpudash.runs.tail import read_events
from tpudash.runs.workers import read_workers


def test_a_keras_fit_started_as_chief_and_as_worker_records_one_run_with_both_workers(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), TF_CPP_MIN_LOG_LEVEL="2")
    runs_dir = str(tmp_path / "runs")
    run_two_workers(runs_dir, "fit", "fit-on-two-workers", env, timeout=180)

    store = RunStore(runs_dir)
    assert store.run_ids() == ["fit-on-two-workers"]
    info = store.info("fit-on-two-workers")
    assert (info.status, info.workers, info.source) == ("done", 2, "keras-callback")
    assert {"loss", "accuracy"} <= set(info.final_metrics)
    worker_events, problems = read_events(store.stream("fit-on-two-workers", "worker-1"))
    assert problems == [] and isinstance(worker_events[-1][1], RunFinished)
    assert any(isinstance(event, Metric) and event.name == "batch_loss" for _, event in worker_events)
    workers = read_workers(store.files("fit-on-two-workers"))
    assert [(w.index, w.task, w.status) for w in workers] == [(0, "chief", "done"), (1, "worker", "done")]
    assert all(w.step_seconds is not None and w.step is not None for w in workers)
    assert [w.straggler for w in workers] == [False, True]  # it sleeps ten times as long after each batch
