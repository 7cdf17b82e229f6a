"""The engine's side of the control pipe: hello, the runtime, runs reported, cancel, refusals, release.

``EngineThread`` runs the engine's real loop over real pipes on a thread, so
these tests exercise the protocol without a TensorFlow import; the process
itself (a kill -9, an abort) is tested in tests/functional/test_app_engine.py.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import pytest

from jobs.base import JobSpec, Param
from jobs.events import Metric
from tpudash.config import Settings, settings_environment
from tpudash.engine.process import EXTRA_JOBS_VARIABLE, EngineThread, engine_job_specs
from tpudash.runs.store import RunStore
from tpudash.accel.runtime import RuntimeDescription

WAIT = 30.0


class FakeRuntime:
    description = RuntimeDescription(kind="CPU", strategy="MirroredStrategy", num_replicas=2, devices=[])

    def summary(self):
        return {"kind": "CPU", "num_replicas": 2}


def path_job(ctx, params):
    ctx.emit(Metric("x0", params["start"][0], 0))
    return {"start": list(params["start"]), "steps": params["steps"]}


PATH = JobSpec("path", "Path", "echoes its params", (Param("start", "floats", (1.0, 4.0)), Param("steps", "int", 3)),
               run=path_job)
entered = threading.Event()


def waiting_job(ctx, params):
    entered.set()
    while not ctx.cancel_event.wait(0.01):
        pass
    ctx.raise_if_cancelled()


WAITS = JobSpec("waits", "Waits", "runs until cancelled", (), run=waiting_job)


class Messages:
    def __init__(self):
        self.queue: queue.Queue = queue.Queue()

    def __call__(self, message):
        self.queue.put(message)

    def next(self, kind: str) -> dict:
        """The next message of ``kind`` (earlier ones of other kinds are skipped)."""
        while True:
            message = self.queue.get(timeout=WAIT)
            if message["type"] == kind:
                return message


@pytest.fixture
def messages():
    return Messages()


@pytest.fixture
def engine(messages, settings):
    handle = EngineThread(messages, settings, {"path": PATH, "waits": WAITS}, FakeRuntime)
    yield handle
    handle.release()


def test_the_engine_says_hello_then_describes_its_runtime(engine, messages):
    assert messages.next("hello")["protocol"] == 1
    assert messages.next("runtime")["description"]["num_replicas"] == 2


def test_a_launch_runs_with_the_params_sent_as_text_and_is_reported_started_then_finished(engine, messages, settings):
    engine.send({"op": "launch", "run_id": "20261123-000000-path-abcdef", "job": "path",
                 "params": {"start": "0.5,2", "steps": "7"}})
    started = messages.next("started")
    assert started["run_id"] == "20261123-000000-path-abcdef"
    finished = messages.next("finished")
    assert finished["status"] == "done"
    data = RunStore(Path(settings.runs_dir)).load("20261123-000000-path-abcdef")
    assert data.info.status == "done" and data.info.summary == {"start": [0.5, 2.0], "steps": 7}


def test_cancel_reaches_the_running_job_and_it_is_recorded_cancelled(engine, messages, settings):
    entered.clear()
    engine.send({"op": "launch", "run_id": "20261123-000000-waits-abcdef", "job": "waits", "params": {}})
    messages.next("started")
    assert entered.wait(WAIT)
    engine.send({"op": "cancel", "run_id": "20261123-000000-waits-abcdef"})
    assert messages.next("finished")["status"] == "cancelled"
    assert RunStore(Path(settings.runs_dir)).load("20261123-000000-waits-abcdef").info.status == "cancelled"


def test_a_job_the_engine_does_not_have_or_bad_params_are_refused_with_the_reason(engine, messages):
    engine.send({"op": "launch", "run_id": "r1", "job": "no-such-job", "params": {}})
    assert "no-such-job" in messages.next("refused")["error"]
    engine.send({"op": "launch", "run_id": "r2", "job": "path", "params": {"steps": "many"}})
    refused = messages.next("refused")
    assert refused["run_id"] == "r2" and "steps" in refused["error"]


def test_release_ends_the_engine_and_its_exit_counts_as_requested(engine, messages):
    messages.next("runtime")
    engine.release()
    exited = messages.next("exited")["exit"]
    assert exited.requested and not engine.send({"op": "describe"})


def test_the_engine_adds_the_jobs_of_the_module_named_by_the_variable():
    specs = engine_job_specs({EXTRA_JOBS_VARIABLE: "tests.engine_jobs"})
    assert "test-abort" in specs and "matmul" in specs
    assert "test-abort" not in engine_job_specs({})


def test_the_engine_loads_the_dashboards_settings_from_its_environment(tmp_path):
    settings = Settings(tpu="none", cpu_devices=4, data_dir=tmp_path / "data", runs_dir=tmp_path / "runs",
                        tpu_timeout=30.0, release_after=600.0, cancel_grace=1.5, engine_nice=5)
    environment = settings_environment(settings, {"TPUDASH_TPU": "v4-8", "PATH": "/bin"})
    assert Settings.load(environ=environment) == settings
    automatic = settings_environment(Settings(runs_dir=tmp_path), {"TPUDASH_TPU": "v4-8"})
    assert "TPUDASH_TPU" not in automatic  # None means detect, in the engine too
