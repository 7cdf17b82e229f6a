"""Cancel, for every kind of job: it stops within one step, keeps what it did, frees the lane.

Each job is started on its own thread with params that would keep it busy
for many seconds; once it has finished its first step, the test cancels it
from the outside (as the TUI's `c` key or a signal does) and checks that at
most one more step follows, that the run is recorded as cancelled with every
event emitted so far on disk, and that the next job runs. The time from the
cancel to the run's RunFinished is printed (run pytest with -s to see it)
and attached to the test report as ``cancel_latency_ms``; it is not asserted.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from jobs import get_job, registry
from jobs.events import Event, Metric, Progress, RunFinished, RunStarted
from tpudash.engine.runner import QueuedRun, Runner

WAIT_SECONDS = 180


def progress_in(unit: str):
    """A job's step: a Progress event in ``unit`` past the start."""
    return lambda event: isinstance(event, Progress) and event.unit == unit and event.done >= 1


@dataclass
class CancelledRun:
    """What happened around one mid-run cancel."""

    run: QueuedRun
    events: list[Event]
    cancel_index: int
    latency_seconds: float
    is_step: object = field(repr=False)

    @property
    def steps_before(self) -> int:
        return sum(1 for event in self.events[: self.cancel_index] if self.is_step(event))

    @property
    def steps_after(self) -> int:
        return sum(1 for event in self.events[self.cancel_index :] if self.is_step(event))


def cancel_after_first_step(runner: Runner, name: str, overrides: dict, is_step) -> CancelledRun:
    """Run ``name`` on a thread; cancel it from here once its first step is reported."""
    spec = get_job(name)
    params = spec.resolve(overrides)
    events: list[Event] = []
    lock = threading.Lock()
    first_step_or_end = threading.Event()
    finished_at: list[float] = []

    def watch(run, event):
        with lock:
            events.append(event)
        if isinstance(event, RunFinished):
            finished_at.append(time.perf_counter())
        if is_step(event) or isinstance(event, RunFinished):
            first_step_or_end.set()

    queued = runner.submit(spec, params, sinks=[watch])
    worker = threading.Thread(target=runner.execute, args=(queued,), name=f"test-{name}", daemon=True)
    worker.start()
    try:
        assert first_step_or_end.wait(WAIT_SECONDS), f"{name} never reported a step"
        assert not finished_at, f"{name} ended before the test could cancel it: {queued.state} {queued.error}"
        with lock:
            cancel_index = len(events)
            cancelled_at = time.perf_counter()
            runner.cancel(queued)
        assert queued.done_event.wait(WAIT_SECONDS), f"{name} did not stop after cancel"
    finally:
        runner.cancel(queued)
        worker.join(WAIT_SECONDS)
    return CancelledRun(queued, events, cancel_index, finished_at[0] - cancelled_at, is_step)


def skip_unless_registered(name: str):
    return pytest.mark.skipif(name not in registry(), reason=f"job {name!r} is not written yet")


LONG_RUNS = [
    # (job, params that would run for many seconds, what one step is)
    pytest.param("matmul", {"m": 128, "k": 128, "n": 128, "repeats": 1000}, progress_in("device"), id="matmul"),
    # One execution in all: cancelled as it starts, it may finish that execution.
    pytest.param(
        "replica-matmul",
        {"source": "random", "m": 512, "k": 512, "n": 512},
        lambda event: isinstance(event, Progress) and event.unit == "run",
        id="replica-matmul",
    ),
    pytest.param("replica-dataset", {"n": 10000, "per_replica": 1}, progress_in("step"), id="replica-dataset"),
    pytest.param("all-reduce", {"repeats": 1000, "size_mb": 4}, progress_in("repeat"), id="all-reduce"),
    pytest.param("gradient-descent", {"steps": 100000}, progress_in("step"), id="gradient-descent"),
    pytest.param(
        "train",
        {
            "source": "synthetic",
            "epochs": 1000,
            "batch_per_replica": 8,
            "limit_train": 2048,
            "limit_test": 64,
            "loop": "fit",
        },
        progress_in("step"),
        id="train-fit",
        marks=skip_unless_registered("train"),
    ),
    pytest.param(
        "train",
        {
            "source": "synthetic",
            "epochs": 1000,
            "batch_per_replica": 8,
            "limit_train": 2048,
            "limit_test": 64,
            "loop": "custom",
        },
        progress_in("step"),
        id="train-custom",
        marks=[skip_unless_registered("train"), pytest.mark.slow],
    ),
    pytest.param(
        "dtensor-mlp",
        {"source": "synthetic", "epochs": 1000, "limit_train": 2048, "limit_test": 128},
        progress_in("step"),
        id="dtensor-mlp",
        marks=skip_unless_registered("dtensor-mlp"),
    ),
]


@pytest.mark.parametrize(("name", "overrides", "is_step"), LONG_RUNS)
def test_cancel_mid_run_stops_within_one_step_keeps_the_record_and_frees_the_lane(
    name, overrides, is_step, runner, store, record_property
):
    cancelled = cancel_after_first_step(runner, name, overrides, is_step)
    run = cancelled.run

    assert run.state == "cancelled", run.error
    assert isinstance(cancelled.events[-1], RunFinished) and cancelled.events[-1].status == "cancelled"
    assert cancelled.steps_before >= 1
    assert cancelled.steps_after <= 1, f"{cancelled.steps_after} steps ran after the cancel"

    # Everything emitted before the cancel is on disk, and the record says cancelled.
    data = store.load(run.run_id)
    assert data.info.status == "cancelled"
    assert data.problems == []
    on_disk = [event for _, event in data.events]
    assert [event.type for event in on_disk] == [event.type for event in cancelled.events]
    assert [(event.name, event.step, event.value) for event in on_disk if isinstance(event, Metric)] == [
        (event.name, event.step, event.value) for event in cancelled.events if isinstance(event, Metric)
    ]
    assert sum(1 for event in on_disk if cancelled.is_step(event)) == cancelled.steps_before + cancelled.steps_after

    # The lane is free: nothing current or queued, and the next job runs to the end.
    assert runner.current is None and not runner.busy
    after = runner.run_now(get_job("gradient-descent"), get_job("gradient-descent").resolve({"steps": 2}))
    assert after.state == "done"

    latency_ms = cancelled.latency_seconds * 1e3
    record_property("cancel_latency_ms", round(latency_ms, 1))
    print(
        f"\ncancel latency {name} ({overrides.get('loop', '')}): {latency_ms:.1f} ms "
        f"({cancelled.steps_after} step(s) after the cancel)"
    )


def test_cancelling_a_queued_run_removes_it_without_running_it(runner, store):
    """A second submit while one runs; cancelling it means it never starts."""
    long_spec = get_job("gradient-descent")
    first_events: list[Event] = []
    first_step = threading.Event()

    def watch_first(run, event):
        first_events.append(event)
        if isinstance(event, Progress) and event.done >= 1:
            first_step.set()

    first = runner.submit(long_spec, long_spec.resolve({"steps": 100000}), sinks=[watch_first])
    first_worker = threading.Thread(target=runner.execute, args=(first,), daemon=True)
    first_worker.start()
    assert first_step.wait(WAIT_SECONDS)

    second_events: list[Event] = []
    matmul = get_job("matmul")
    second = runner.submit(
        matmul, matmul.resolve({"m": 8, "k": 8, "n": 8}), sinks=[lambda run, event: second_events.append(event)]
    )
    second_worker = threading.Thread(target=runner.execute, args=(second,), daemon=True)
    second_worker.start()
    assert runner.current is first and runner.queued() == [second]

    runner.cancel(second)
    assert second.state == "cancelled" and second.done_event.is_set()
    assert runner.queued() == []
    second_worker.join(WAIT_SECONDS)
    assert not second_worker.is_alive()
    assert runner.current is first and first.state == "running"  # the running job is untouched

    runner.cancel(first)
    first_worker.join(WAIT_SECONDS)
    assert first.state == "cancelled"
    assert second_events == [] and second.run_dir is None
    assert not any(isinstance(event, RunStarted) and event.job == "matmul" for event in first_events)

    # The lane takes the next job, and only the runs that started are on disk.
    third = runner.run_now(matmul, matmul.resolve({"m": 8, "k": 8, "n": 8, "devices": "0"}))
    assert third.state == "done"
    assert {(info.run_id, info.status) for info in store.list_runs()} == {
        (first.run_id, "cancelled"),
        (third.run_id, "done"),
    }
