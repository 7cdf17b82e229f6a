"""The runner: one lane in submit order, cancel, failures recorded, sinks isolated."""

from __future__ import annotations

import json
import threading

import pytest

from jobs.base import JobSpec, Param
from jobs.events import Log, Metric, Progress, RunFinished, RunStarted
from tpudash.engine.runner import Runner


class FakeRuntime:
    """Stands in for tpudash.accel.description.Runtime; the runner only needs summary()."""

    def summary(self):
        return {"kind": "CPU", "strategy": "MirroredStrategy", "num_replicas": 8}


def counting_job(ctx, params):
    for step in range(params["steps"]):
        ctx.raise_if_cancelled()
        ctx.emit(Metric("loss", 1.0 / (step + 1), step))
        ctx.progress(step + 1, params["steps"], "step")
    return {"steps": params["steps"]}


COUNT = JobSpec("count", "Count", "emits a metric per step", (Param("steps", "int", 3, minimum=1),), counting_job)


def raising_job(ctx, params):
    ctx.log("about to fail")
    raise ValueError("the model diverged")


RAISE = JobSpec("raise", "Raise", "always fails", (), raising_job)


@pytest.fixture
def fake_runner(store):
    return Runner(FakeRuntime, store)


def test_a_run_is_recorded_with_its_events_and_summary(fake_runner, store):
    run = fake_runner.run_now(COUNT, {"steps": 3})
    assert run.state == "done"
    data = store.load(run.run_id)
    assert data.info.status == "done"
    assert data.info.summary == {"steps": 3}
    kinds = [type(event) for _, event in data.events]
    assert kinds[0] is RunStarted and kinds[-1] is RunFinished
    assert [event.value for _, event in data.metrics()] == [1.0, 0.5, 1.0 / 3]
    assert data.info.final_metrics == {"loss": 1.0 / 3}


def test_a_job_that_raises_is_recorded_failed_and_the_next_job_runs(fake_runner, store):
    failed = fake_runner.run_now(RAISE, {})
    assert failed.state == "failed"
    info = store.load(failed.run_id).info
    assert info.status == "failed"
    assert info.error == "ValueError: the model diverged"
    finished = store.load(failed.run_id).events[-1][1]
    assert "Traceback" in finished.traceback and "raising_job" in finished.traceback
    assert fake_runner.run_now(COUNT, {"steps": 2}).state == "done"


def test_a_sink_that_raises_does_not_stop_the_job(fake_runner):
    seen = []

    def broken_sink(run, event):
        raise RuntimeError("front end crashed")

    fake_runner.add_sink(broken_sink)
    run = fake_runner.run_now(COUNT, {"steps": 2}, sinks=[lambda run, event: seen.append(event.type)])
    assert run.state == "done"
    assert seen[0] == "run_started" and seen[-1] == "run_finished"


def test_cancel_between_steps_records_cancelled_with_the_metrics_so_far(fake_runner, store):
    def cancel_after_second_metric(run, event):
        if isinstance(event, Metric) and event.step == 1:
            fake_runner.cancel(run)

    run = fake_runner.run_now(COUNT, {"steps": 50}, sinks=[cancel_after_second_metric])
    assert run.state == "cancelled"
    data = store.load(run.run_id)
    assert data.info.status == "cancelled"
    assert [event.step for _, event in data.metrics()] == [0, 1]


def test_runs_take_the_lane_in_submit_order_and_a_cancelled_queued_run_never_starts(store):
    gate = threading.Event()
    order = []

    def gated_job(ctx, params):
        order.append(params["name"])
        if params["name"] == "first":
            gate.wait(timeout=30)
        return {}

    spec = JobSpec("gated", "Gated", "waits for a gate", (Param("name", "str", "x"),), gated_job)
    runner = Runner(FakeRuntime, store)
    first = runner.submit(spec, {"name": "first"})
    second = runner.submit(spec, {"name": "second"})
    third = runner.submit(spec, {"name": "third"})
    started = threading.Event()
    runner.add_sink(lambda run, event: started.set() if isinstance(event, RunStarted) else None)
    threads = [threading.Thread(target=runner.execute, args=(run,)) for run in (third, second, first)]
    for thread in threads:
        thread.start()
    assert started.wait(timeout=30)
    assert runner.current is first
    assert runner.queued() == [second, third]
    runner.cancel(second)
    assert second.state == "cancelled" and runner.queued() == [third]
    gate.set()
    for thread in threads:
        thread.join(timeout=30)
    assert order == ["first", "third"]
    assert [run.state for run in (first, second, third)] == ["done", "cancelled", "done"]
    assert {info.run_id for info in store.list_runs()} == {first.run_id, third.run_id}


def test_a_runtime_that_cannot_start_fails_the_run_without_a_record(store):
    def no_runtime():
        raise RuntimeError("TPU did not answer")

    runner = Runner(no_runtime, store)
    events = []
    run = runner.run_now(COUNT, {"steps": 1}, sinks=[lambda run, event: events.append(event)])
    assert run.state == "failed"
    assert "TPU did not answer" in run.error
    assert isinstance(events[-1], RunFinished) and events[-1].status == "failed"
    assert store.list_runs() == []


def test_events_file_is_one_json_object_per_line(fake_runner, store):
    run = fake_runner.run_now(COUNT, {"steps": 2}, sinks=[])
    lines = (store.find(run.run_id) / "events.jsonl").read_text().splitlines()
    payloads = [json.loads(line) for line in lines]
    assert [payload["type"] for payload in payloads] == [
        "run_started",
        "metric",
        "progress",
        "metric",
        "progress",
        "run_finished",
    ]
    assert all(isinstance(payload["t"], float) for payload in payloads)


def logging_job(ctx, params):
    ctx.log("preparing data")
    for step in range(params["steps"]):
        ctx.progress(step + 1, params["steps"], "step")
        ctx.log(f"step {step + 1} done", level="debug")
    ctx.log("nearly there", level="warning")
    return {}


LOGGING = JobSpec(
    "logging", "Logging", "logs and reports progress", (Param("steps", "int", 2, minimum=1),), logging_job
)


def test_log_and_progress_events_reach_every_sink_in_order(fake_runner, store):
    """Every sink (runner-wide ones and the run's own) gets each Log and Progress, in emit order."""
    runner_wide_a, runner_wide_b, per_run = [], [], []
    fake_runner.add_sink(lambda run, event: runner_wide_a.append(event))
    fake_runner.add_sink(lambda run, event: runner_wide_b.append(event))
    run = fake_runner.run_now(LOGGING, {"steps": 2}, sinks=[lambda run, event: per_run.append(event)])
    assert run.state == "done"
    expected = [
        Log("info", "preparing data"),
        Progress(1, 2, "step"),
        Log("debug", "step 1 done"),
        Progress(2, 2, "step"),
        Log("debug", "step 2 done"),
        Log("warning", "nearly there"),
    ]
    for seen in (runner_wide_a, runner_wide_b, per_run):
        assert isinstance(seen[0], RunStarted) and isinstance(seen[-1], RunFinished)
        assert seen[1:-1] == expected
    # The record is a sink too: the run's file holds the same events in the same order.
    recorded = [event for _, event in store.load(run.run_id).events]
    assert recorded[1:-1] == expected
