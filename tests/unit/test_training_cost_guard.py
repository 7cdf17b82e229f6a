"""What tpudash does per training step stays within a budget: counted, never timed.

Training under tpudash must keep pace with plain Keras (issue 37: ≥ 0.98 ×).
Wall time on a shared machine is too noisy to guard that in the default
suite, so this guard counts instead: a run shaped like the train job's
Keras ``fit`` (the job's own ``TrainingReporter`` called as its Keras
callback calls it, once per step) goes through the engine's ``Runner``, the
run's recorder and the headless console sink, and on the job's thread it
counts per step:

- Python function calls (``sys.setprofile``): the CPU the step's reporting costs;
- writes into events.jsonl and the bytes they carry;
- fsyncs, and run.json rewrites (``os.replace``).

The budgets hold today's figures with headroom for small changes; a flush
per step, a run.json per step or reporting that does several times the work
fails them. The slow side of the same question (examples/s and CPU time
against plain Keras, measured) is ``python -m tests.benchmarks --only overhead``.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import types
from dataclasses import dataclass, field

import pytest
from rich.console import Console

from jobs.base import JobSpec
from jobs.trainplan import TrainingPlan
from jobs.trainreport import TrainingReporter
from tpudash.cli.sinks import ConsoleSink
from tpudash.engine.runner import Runner
from tpudash.runs import recorder as recorder_module

WARM_UP_STEPS = 20
COUNTED_STEPS = 200
REPLICAS = 8
BATCH_PER_REPLICA = 64

# Today (9baa726): 76 Python calls (114 before event lines skipped the
# generic path for plain values), 3 writes (batch_loss, batch_accuracy, the
# step's progress) of 308 bytes, no fsync and no run.json per step. Room for
# small growth, none for a new kind of cost, nor for the generic path back.
CALLS_PER_STEP_BUDGET = 110
WRITES_PER_STEP_BUDGET = 3
BYTES_PER_STEP_BUDGET = 400
# fsync: once a second at most between epochs; 200 steps that took 10 s would still pass.
FSYNCS_PER_STEP_BUDGET = 0.05
RUN_FILE_REWRITES_PER_STEP_BUDGET = 0


class NullTerminal(io.TextIOBase):
    """Swallows output but says it is a terminal, so rich draws its live display as on screen."""

    def isatty(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return len(text)


@dataclass
class StepCosts:
    """What the job's thread did over the counted steps."""

    calls: int = 0
    writes: int = 0
    bytes_written: int = 0
    fsyncs: int = 0
    run_file_rewrites: int = 0
    steps: int = 0
    thread: int | None = None
    counting: bool = False
    written_to: list = field(default_factory=list)

    def per_step(self) -> dict[str, float]:
        return {
            "calls": self.calls / self.steps,
            "writes": self.writes / self.steps,
            "bytes": self.bytes_written / self.steps,
            "fsyncs": self.fsyncs / self.steps,
            "run_file_rewrites": self.run_file_rewrites / self.steps,
        }


def count_os_calls(costs: StepCosts, monkeypatch: pytest.MonkeyPatch) -> None:
    """Wrap os.write, os.fsync and os.replace: counted when the job's thread calls them while counting."""
    write, fsync, replace = os.write, os.fsync, os.replace

    def counted() -> bool:
        return costs.counting and threading.get_ident() == costs.thread

    def counting_write(fd, data):
        if counted():
            costs.writes += 1
            costs.bytes_written += len(data)
        return write(fd, data)

    def counting_fsync(fd):
        if counted():
            costs.fsyncs += 1
        return fsync(fd)

    def counting_replace(source, target, **options):
        if counted() and str(target).endswith("run.json"):
            costs.run_file_rewrites += 1
        return replace(source, target, **options)

    monkeypatch.setattr(os, "write", counting_write)
    monkeypatch.setattr(os, "fsync", counting_fsync)
    monkeypatch.setattr(os, "replace", counting_replace)


def without_tensorflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reporter's TensorBoard metadata from a stand-in, unless TensorFlow is loaded already (seconds to import).

    With no TensorBoard directory the reporter uses TensorFlow for nothing
    but this metadata object, built once.
    """
    if "tensorflow" in sys.modules:
        return
    summary_pb2 = types.SimpleNamespace(
        SummaryMetadata=type("SummaryMetadata", (), {"__init__": lambda self, **_: None, "PluginData": dict}),
        DATA_CLASS_SCALAR=1,
    )
    names = ("tensorflow", "tensorflow.core", "tensorflow.core.framework")
    modules = [types.ModuleType(name) for name in names]
    modules[0].core = modules[1]  # type: ignore[attr-defined]
    modules[1].framework = modules[2]  # type: ignore[attr-defined]
    modules[2].summary_pb2 = summary_pb2  # type: ignore[attr-defined]
    for name, module in zip(names, modules):
        monkeypatch.setitem(sys.modules, name, module)


def train_shaped_job(costs: StepCosts) -> JobSpec:
    """One epoch reported step by step as the train job's Keras callback reports it; the counted steps in the middle."""

    def run(ctx, params):
        total_steps = WARM_UP_STEPS + COUNTED_STEPS
        global_batch = REPLICAS * BATCH_PER_REPLICA
        plan = TrainingPlan.make(
            {"batch_per_replica": BATCH_PER_REPLICA, "steps_per_execution": 1, "epochs": 1},
            REPLICAS,
            total_steps * global_batch,
            global_batch,
        )
        reporter = TrainingReporter(ctx, plan, None, profile=None)
        reporter.begin_epoch(1)

        def step(done: int) -> None:
            # What jobs.trainreport's Reporting callback does around each batch.
            reporter.before_execution(plan.steps_per_execution)
            reporter.after_execution(done, 2.0 / done, min(1.0, done / total_steps))
            ctx.cancelled()

        for done in range(1, WARM_UP_STEPS + 1):
            step(done)
        costs.thread = threading.get_ident()

        def profile(frame, event, arg):
            if event == "call":
                costs.calls += 1

        costs.counting = True
        sys.setprofile(profile)
        try:
            for done in range(WARM_UP_STEPS + 1, total_steps + 1):
                step(done)
        finally:
            sys.setprofile(None)
            costs.counting = False
        costs.steps = COUNTED_STEPS
        reporter.end_epoch({"loss": 0.5, "accuracy": 0.5}, {"loss": 0.5, "accuracy": 0.5})
        reporter.close()
        return {}

    return JobSpec("train-shaped", "Train-shaped", "reports steps as the train job does", (), run)


class FakeRuntime:
    """What the runner asks of a runtime: its summary for run_started."""

    def summary(self):
        return {"kind": "CPU", "strategy": "MirroredStrategy", "num_replicas": REPLICAS}


def measure_step_costs(store, monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    costs = StepCosts()
    without_tensorflow(monkeypatch)
    count_os_calls(costs, monkeypatch)
    console = Console(file=NullTerminal(), force_terminal=True, width=120)
    sink = ConsoleSink(console=console)
    try:
        run = Runner(FakeRuntime, store, sinks=[sink]).run_now(train_shaped_job(costs), {})
    finally:
        sink.close()
    assert run.state == "done", run.error
    return costs.per_step()


def over_budget(per_step: dict[str, float]) -> list[str]:
    budgets = {
        "calls": CALLS_PER_STEP_BUDGET,
        "writes": WRITES_PER_STEP_BUDGET,
        "bytes": BYTES_PER_STEP_BUDGET,
        "fsyncs": FSYNCS_PER_STEP_BUDGET,
        "run_file_rewrites": RUN_FILE_REWRITES_PER_STEP_BUDGET,
    }
    return [f"{name} {per_step[name]:.2f} > {budget}" for name, budget in budgets.items() if per_step[name] > budget]


def test_a_training_step_costs_tpudash_no_more_than_its_budget(store, monkeypatch):
    per_step = measure_step_costs(store, monkeypatch)
    over = over_budget(per_step)
    assert over == [], f"over budget per step: {'; '.join(over)} (all: {per_step})"
    # The step was reported at all: its events reached the file.
    assert per_step["writes"] >= 1 and per_step["calls"] >= 50, per_step


def test_the_budget_catches_an_fsync_per_step(store, monkeypatch):
    # A recorder that syncs at every write: the regression a per-step flush would be.
    monkeypatch.setattr(recorder_module, "FSYNC_INTERVAL_SECONDS", 0.0)
    per_step = measure_step_costs(store, monkeypatch)
    assert [line.split()[0] for line in over_budget(per_step)] == ["fsyncs"], per_step
