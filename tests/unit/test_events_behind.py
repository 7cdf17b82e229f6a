"""A step's events are emitted on a thread of their own while the next step runs, in order, failures raised back."""

from __future__ import annotations

import threading

import pytest

from jobs.base import JobContext
from jobs.events import Metric, Progress, Stage
from jobs.eventsbehind import THREAD_NAME, EventsBehind
from jobs.trainplan import TrainingPlan
from jobs.trainreport import STAGE_FIRST_STEP, STAGE_TRAINING, TrainingReporter


class Emitted:
    """An emit that records (thread name, event), and can be held until the test lets it go."""

    def __init__(self, held: bool = False) -> None:
        self.events: list[tuple[str, object]] = []
        self.gate = threading.Event()
        if not held:
            self.gate.set()

    def __call__(self, event: object) -> None:
        self.gate.wait()
        self.events.append((threading.current_thread().name, event))


def events_behind_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith(THREAD_NAME)]


def test_events_handed_over_are_emitted_in_order_on_their_own_thread_and_the_caller_goes_on_at_once():
    emitted = Emitted(held=True)
    behind = EventsBehind(emitted)
    behind.later(["a1", "a2"])  # returns while the emit is held: the caller is not waiting for it
    behind.later(["b1"])
    assert emitted.events == []
    emitted.gate.set()
    behind.flush()
    assert [event for _, event in emitted.events] == ["a1", "a2", "b1"]
    assert {name.split("_")[0] for name, _ in emitted.events} == {THREAD_NAME}
    behind.close()


def test_flush_returns_only_once_what_was_handed_over_is_out():
    order: list[str] = []
    gate = threading.Event()

    def emit(event: str) -> None:
        gate.wait()
        order.append("emitted")

    behind = EventsBehind(emit)
    behind.later(["step 1"])
    flushing = threading.Event()

    def training_thread() -> None:
        flushing.set()
        behind.flush()
        order.append("flushed")

    trainer = threading.Thread(target=training_thread)
    trainer.start()
    flushing.wait()
    gate.set()  # the emit goes on only once the flush has begun
    trainer.join()
    assert order == ["emitted", "flushed"]
    behind.close()


def test_a_failed_emit_is_raised_on_the_training_thread_and_nothing_after_it_is_emitted():
    emitted: list[str] = []

    def emit(event: str) -> None:
        if event == "bad":
            raise OSError("disk full")
        emitted.append(event)

    behind = EventsBehind(emit)
    with pytest.raises(OSError, match="disk full"):
        behind.later(["ok", "bad", "after in the same step"])
        behind.later(["next step"])  # raises here if the failure came first, else the flush does
        behind.flush()
    assert emitted == ["ok"]
    behind.close()


def test_close_emits_what_is_pending_and_ends_its_thread():
    before = set(events_behind_threads())
    emitted = Emitted()
    behind = EventsBehind(emitted)
    behind.later(["last step"])
    behind.close()
    assert [event for _, event in emitted.events] == ["last step"]
    assert set(events_behind_threads()) <= before


def test_the_reporter_emits_a_steps_events_behind_and_keeps_the_runs_order(tmp_path):
    emitted = Emitted()
    ctx = JobContext(runtime=None, emit=emitted, run_dir=tmp_path)
    plan = TrainingPlan.make({"batch_per_replica": 1, "steps_per_execution": 1, "epochs": 1}, 1, 2, 1)
    reporter = TrainingReporter(ctx, plan, None, profile=None)
    reporter.begin_epoch(1)
    for step in (1, 2):
        reporter.before_execution(1)
        reporter.after_execution(step, mean_loss=1.0 / step, mean_accuracy=0.5)
    reporter.end_epoch({"loss": 0.75, "accuracy": 0.5}, {"loss": 0.8, "accuracy": 0.5})
    reporter.close()
    shown = [
        (
            thread.startswith(THREAD_NAME),
            type(event).__name__,
            getattr(event, "name", None) or getattr(event, "unit", None),
        )
        for thread, event in emitted.events
    ]
    assert shown[:8] == [
        (False, "Stage", STAGE_FIRST_STEP),
        (False, "Stage", STAGE_TRAINING),
        (True, "Metric", "batch_loss"),
        (True, "Metric", "batch_accuracy"),
        (True, "Progress", "step"),
        (True, "Metric", "batch_loss"),
        (True, "Metric", "batch_accuracy"),
        (True, "Progress", "step"),
    ]
    # The epoch's figures come after its last step's, from the training thread.
    assert all(not behind for behind, _, _ in shown[8:]) and shown[-1] == (False, "Progress", "epoch")
    assert [event.step for _, event in emitted.events if isinstance(event, Metric) and event.name == "batch_loss"] == [
        1,
        2,
    ]
    assert isinstance(emitted.events[0][1], Stage) and isinstance(emitted.events[4][1], Progress)
