"""The engine's runs as profile writers: the runner's responder, jobs without steps, the train job's window.

Fast tests use fake jobs and a fake framework profiler; the real one trains a tiny model with
``tpudash run train --profile-steps 2-4`` and reads the capture back with XProf.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from jobs.base import JobSpec, Param
from jobs.events import Artifact, Log
from jobs.trainplan import ProfileWindow
from tests.conftest import REPO_ROOT
from tpudash.engine.profiling import NO_STEPS_REASON
from tpudash.engine.runner import Runner
from tpudash.profiles import capture as profile_capture
from tpudash.profiles.requests import read_answers, request_profile


class FakeRuntime:
    def summary(self):
        return {"kind": "CPU", "num_replicas": 8}


class FakeFrameworkProfiler:
    """Writes a capture where XProf would find one, as TensorFlow's profiler does at ``stop``."""

    def __init__(self) -> None:
        self.started = 0
        self.markers: list[int] = []

    def start(self, logdir: str) -> None:
        self.logdir = logdir
        self.started += 1

    def stop(self) -> None:
        folder = Path(self.logdir) / "plugins" / "profile" / f"2026_11_28_07_05_5{self.started}"
        folder.mkdir(parents=True)
        (folder / "vm.xplane.pb").write_bytes(b"xplane")

    @contextmanager
    def _marked(self, step: int):
        self.markers.append(step)
        yield

    def marker(self, step: int):
        return self._marked(step)

    def is_busy(self, error: BaseException) -> bool:
        return False


@pytest.fixture
def framework(monkeypatch) -> FakeFrameworkProfiler:
    fake = FakeFrameworkProfiler()
    monkeypatch.setattr(profile_capture, "framework_profiler", lambda name: fake)
    return fake


def stepping_job(ctx, params):
    """A loop of steps as the train job runs them: hooks and a marker around each step."""
    ctx.keep_summary({"profiler": type(ctx.profiler).__name__})
    ctx.profiler.schedule(2, 3)
    for step in range(1, params["steps"] + 1):
        ctx.profiler.step_begin(step)
        with ctx.profiler.marker(step):
            pass
        ctx.profiler.step_end(step)
    return {"profiler": type(ctx.profiler).__name__, "profile": None}


STEPPING = JobSpec(
    "stepping", "Stepping", "steps", (Param("steps", "int", 5, minimum=1),), stepping_job, profiles_steps=True
)


def test_a_job_with_steps_is_given_the_runs_responder_and_its_window_lands_in_the_run(store, framework):
    events: list = []
    run = Runner(FakeRuntime, store).run_now(STEPPING, {"steps": 5}, sinks=[lambda _, event: events.append(event)])
    assert run.state == "done" and run.summary["profiler"] == "ProfileResponder"
    captures = store.files(run.run_id).local_dir / "profile" / "plugins" / "profile"
    assert [path.name for path in captures.iterdir()] == ["2026_11_28_07_05_51"]
    assert framework.markers == [1, 2, 3, 4, 5]
    [answer] = read_answers(store.files(run.run_id))
    assert (answer.state, answer.first_step, answer.last_step) == ("done", 2, 3)
    # The run says where its profile is: an artifact, its log, its summary.
    assert [event.path for event in events if isinstance(event, Artifact)] == [str(captures / "2026_11_28_07_05_51")]
    assert any(isinstance(event, Log) and "profile of steps 2–3 captured" in event.text for event in events)
    assert run.summary["profile"] == str(captures / "2026_11_28_07_05_51")


def test_a_job_without_steps_answers_a_request_that_it_has_none(store):
    def asking_job(ctx, params):
        """A job without steps, asked for a profile while it runs."""
        request_profile(store.files(ctx.run_dir.name))
        return {"profiler": ctx.profiler}

    asking = JobSpec("asking", "Asking", "no steps", (), asking_job)
    run = Runner(FakeRuntime, store).run_now(asking, {})
    assert run.state == "done" and run.summary["profiler"] is None  # no hooks handed to a job that never steps
    [answer] = read_answers(store.files(run.run_id))
    assert (answer.state, answer.reason) == ("failed", NO_STEPS_REASON)


def test_a_request_left_pending_at_the_runs_end_is_answered_why(store, framework):
    def one_step(ctx, params):
        request_profile(store.files(ctx.run_dir.name))
        return {}

    spec = JobSpec("one", "One", "one step", (), one_step, profiles_steps=True)
    run = Runner(FakeRuntime, store).run_now(spec, {})
    [answer] = read_answers(store.files(run.run_id))
    assert (answer.state, answer.reason) == ("failed", "the run ended before the profile started")


class RecordingProfiler:
    """What the train job's window calls on ``JobContext.profiler``, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def schedule(self, first: int, last: int) -> None:
        self.calls.append(("schedule", first, last))

    def step_begin(self, step: int) -> None:
        self.calls.append(("begin", step))

    def step_end(self, step: int) -> None:
        self.calls.append(("end", step))

    @contextmanager
    def _marker(self, step: int):
        self.calls.append(("enter", step))
        yield
        self.calls.append(("exit", step))

    def marker(self, step: int):
        return self._marker(step)


class FakeContext:
    def __init__(self) -> None:
        self.logs: list[tuple[str, str]] = []

    def log(self, text: str, level: str = "info") -> None:
        self.logs.append((level, text))


def test_the_train_jobs_window_goes_through_the_profiler_around_each_execution(tmp_path):
    profiler, ctx = RecordingProfiler(), FakeContext()
    window = ProfileWindow(ctx, (3, 4), tmp_path, profiler)
    for first, last in ((1, 2), (3, 4), (5, 6)):  # executions of 2 steps
        window.before(first, last)
        window.after(last)
    window.finish(6)
    assert profiler.calls == [
        ("schedule", 3, 4),
        ("begin", 1),
        ("enter", 1),
        ("exit", 1),
        ("end", 2),
        ("begin", 3),
        ("enter", 3),
        ("exit", 3),
        ("end", 4),
        ("begin", 5),
        ("enter", 5),
        ("exit", 5),
        ("end", 6),
    ]
    assert not list(tmp_path.iterdir())  # no profiler of its own: the run's writes into <run>/profile


def test_an_execution_that_spans_the_windows_first_step_begins_it(tmp_path):
    profiler = RecordingProfiler()
    window = ProfileWindow(FakeContext(), (3, 4), tmp_path, profiler)
    window.before(1, 4)  # steps_per_execution 4: step 3 begins inside this execution
    assert ("begin", 3) in profiler.calls


def test_a_window_never_reached_is_said_with_a_profiler_as_without(tmp_path):
    ctx = FakeContext()
    window = ProfileWindow(ctx, (50, 60), tmp_path, RecordingProfiler())
    window.before(1, 1)
    window.after(1)
    window.finish(2)
    assert ctx.logs == [("warning", "profile_steps 50-60 was never reached (the run ended at step 2): no trace")]


def test_a_live_request_without_a_window_only_marks_steps(tmp_path):
    profiler = RecordingProfiler()
    window = ProfileWindow(FakeContext(), None, tmp_path, profiler)
    window.before(1, 1)
    window.after(1)
    window.finish(1)
    assert profiler.calls == [("begin", 1), ("enter", 1), ("exit", 1), ("end", 1)]


@pytest.mark.slow  # TensorFlow, a model traced and XProf's converter: about 20 s on 2 cores
def test_run_with_profile_steps_then_profile_capture_prints_xprofs_summary(isolated_runs_dir, tmp_path):
    """The real thing: a tiny train run profiles steps 2-4 into <run>/profile; `tpudash profile` reads it."""
    environment = dict(os.environ, TPUDASH_TELEMETRY_INTERVAL="0")
    for name in ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_LOAD_LIBRARY"):
        environment.pop(name, None)
    tiny = ["source=synthetic", "batch_per_replica=4", "limit_train=256", "limit_test=32", "epochs=1"]
    command = [sys.executable, "-m", "tpudash", "run", "train", "--json", "--profile-steps", "2-4"]
    for assignment in tiny:
        command += ["--set", assignment]
    trained = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, env=environment, timeout=300)
    assert trained.returncode == 0, trained.stderr[-2000:]
    [run_dir] = [path for path in isolated_runs_dir.iterdir() if path.is_dir() and not path.name.startswith(".")]
    [capture] = list((run_dir / "profile" / "plugins" / "profile").iterdir())
    assert list(capture.glob("*.xplane.pb"))
    listed = subprocess.run(
        [sys.executable, "-m", "tpudash", "profile", run_dir.name, "--capture", capture.name, "--json"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=environment,
        timeout=300,
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    summary = json.loads(listed.stdout)
    assert summary["run_id"] == run_dir.name and summary["capture"] == capture.name
    assert summary["profile_dir"] == str(run_dir / "profile")
    assert summary["steps"] >= 1 and summary["step_time_ms"]["avg"] > 0  # the step markers were seen
    assert summary["verdict"] in ("input-bound", "not input-bound")


def test_the_refuser_answers_only_its_own_workers_requests_asked_since_the_run_began(store):
    from tpudash.engine.profiling import StepsRefuser
    from tpudash.runs.layout import new_run_id

    run_id = new_run_id("matmul")
    recorder = store.create(run_id, "matmul", {}, {"kind": "CPU"})
    files = store.files(run_id)
    try:
        first = request_profile(files, worker=1)
        assert StepsRefuser(files, worker=1, started_at=first.requested_at + 10).answer_pending() == 0  # too old
        refuser = StepsRefuser(files, worker=1, started_at=first.requested_at)
        theirs = request_profile(files)  # the chief's
        assert refuser.answer_pending() == 1
        answered = {answer.id: answer for answer in read_answers(files)}
        assert theirs.id not in answered
        assert (answered[first.id].reason, answered[first.id].worker) == (NO_STEPS_REASON, 1)
        assert refuser.answer_pending() == 0  # each request once
    finally:
        recorder.close()
