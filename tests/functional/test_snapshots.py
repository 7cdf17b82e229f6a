"""Every screen at 80×24 and 160×48, compared with its committed SVG (pytest-textual-snapshot).

A change that moves one cell of any screen fails here; the report
(snapshot_report.html, written on failure) shows old and new side by side.
Reviewing those SVGs is part of any UI change: after a change you mean,
``python -m pytest -n 0 tests/functional/test_snapshots.py --snapshot-update``
writes the new ones, and the diff of ``__snapshots__`` goes into the commit.

To be the same on every machine the app sees only fixed things: a runtime
description and host scan written here (no TensorFlow, no engine process),
runs written here with fixed times (the three kinds of result the run view
draws: training curves and per-replica values, gradient descent's path,
matmul's per-device table; replica-matmul's products, in a test of its
own), a fixed runs directory path, UTC, and no telemetry sampling.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobs import registry
from jobs.events import Log, Metric, Progress, ReplicaValues, RunFinished, RunStarted, Stage, Table
from tpudash.accel.description import LogicalDeviceInfo, Runtime, RuntimeDescription
from tpudash.config import Settings
from tpudash.engine.inthread import EngineThread
from tpudash.runs.layout import SOURCE_JOB
from tpudash.runs.recorder import RunRecorder
from tpudash.tui.app import TpudashApp
from tpudash.tui.plots import plots_drawn

SIZES = {"80x24": (80, 24), "160x48": (160, 48)}
# Fixed, not tmp_path: the runs directory's path is on screen (Help, History).
RUNS_DIR = Path("/tmp/tpudash-snapshots/runs")
STARTED = 1_795_000_000.0  # 18 Nov 2026, UTC
ENGINE_PID = 4242
CPUS = [f"/job:localhost/replica:0/task:0/device:CPU:{index}" for index in range(8)]

# What a job's run_started says it ran on (``Runtime.summary()`` on the 8-device CPU default).
JOB_RUNTIME = {
    "backend": "tensorflow",
    "kind": "CPU",
    "strategy": "MirroredStrategy",
    "num_replicas": 8,
    "simulated": True,
    "tf_version": "2.21.0",
    "keras_version": "3.15.1",
}
DESCRIPTION = RuntimeDescription(
    kind="CPU",
    strategy="MirroredStrategy",
    num_replicas=8,
    devices=[LogicalDeviceInfo(index, name, "CPU") for index, name in enumerate(CPUS)],
    simulated=True,
    tf_version="2.21.0",
    keras_version="3.15.0",
    host="snapshot-host",
    init_seconds=1.25,
    notes=["8 logical CPU devices stand in for a TPU board"],
)
HOST_CHECK = {
    "chips": {"chip_type": None, "count": 0, "hbm_gib_per_chip": None, "cores_per_chip": None, "scan_error": None},
    "distributions": {"tensorflow": "2.21.0"},
    "holders": [],
    "tensorflow_found": True,
    "diagnoses": [],
    "tensorflow_build": "tensorflow 2.21.0",
    "install_line": 'pip install "tensorflow>=2.20,<2.22"',
}


@dataclass
class FixedHostCheck:
    def to_dict(self) -> dict:
        return dict(HOST_CHECK)


def record_run(run_id: str, job: str, params: dict, events: list, *, seconds: float) -> None:
    """A finished run on disk, its events ``seconds`` apart in time from ``STARTED`` on."""
    run_dir = RUNS_DIR / run_id
    run_dir.mkdir(parents=True)
    started = STARTED + len(list(RUNS_DIR.iterdir())) * 600
    meta = {
        "source": SOURCE_JOB,
        "run_id": run_id,
        "job": job,
        "params": params,
        "runtime": DESCRIPTION.to_dict(),
        "status": "running",
        "started": started,
        "finished": None,
        "pid": None,
        "pid_start": None,
        "host": "snapshot-host",
    }
    recorder = RunRecorder(run_dir, meta)
    recorder.record(RunStarted(run_id, job, params, JOB_RUNTIME, started), timestamp=started)
    step = seconds / max(1, len(events))
    for index, event in enumerate(events, start=1):
        recorder.record(event, timestamp=started + index * step)


def training_events() -> list:
    events: list = [
        Stage("making synthetic MNIST-shaped data", 4096, 4096),
        Stage("building the model", 0, None),
        Stage("tracing and running the first step", 0, None),
        Stage("training", 0, None),
    ]
    steps_per_epoch = 30
    for epoch in range(3):
        for batch in range(steps_per_epoch):
            step = epoch * steps_per_epoch + batch
            loss = 2.3 * 0.97**step + 0.05 * ((step * 7) % 5) / 5
            events.append(Metric("batch_loss", loss, step, epoch=epoch))
            events.append(Metric("batch_accuracy", 1 - loss / 2.5, step, epoch=epoch))
            events.append(Progress(batch + 1, steps_per_epoch, "step"))
        end = (epoch + 1) * steps_per_epoch
        val_loss = 2.3 * 0.97**end + 0.04
        events += [
            Metric("loss", 2.3 * 0.97**end, end, epoch=epoch),
            Metric("accuracy", 1 - 0.97**end, end, epoch=epoch),
            Metric("loss", val_loss, end, epoch=epoch, split="val"),
            Metric("accuracy", 1 - val_loss / 2.5, end, epoch=epoch, split="val"),
            Progress(epoch + 1, 3, "epoch"),
            Log("info", f"epoch {epoch + 1}/3: loss {2.3 * 0.97**end:.4f}  val_loss {val_loss:.4f}"),
        ]
        events.append(
            ReplicaValues("val loss per replica", [round(val_loss + 0.01 * (index - 4), 4) for index in range(8)], CPUS)
        )
    events += [
        Stage("evaluating on the test split", 0, None),
        Metric("loss", 0.44, 90, split="test"),
        Metric("accuracy", 0.86, 90, split="test"),
        RunFinished("done", {"test_loss": 0.44, "test_accuracy": 0.86, "examples_per_second": 1185.0}),
    ]
    return events


def gradient_descent_events() -> list:
    x0, x1 = 1.0, 4.0
    events: list = []
    for step in range(40):
        events += [Metric("x0", x0, step), Metric("x1", x1, step), Metric("loss", x0**2 + x1**2, step)]
        x0, x1 = x0 * 0.8, x1 * 0.8
    events.append(RunFinished("done", {"loss": x0**2 + x1**2, "x": [x0, x1]}))
    return events


def matmul_events() -> list:
    rows = [
        [name, 1024, 2.5e-4, 1e-3, "pass", 0.61 + 0.01 * index, 3.4 + 0.1 * index] for index, name in enumerate(CPUS)
    ]
    return [
        Log("info", "1024×1024 float32 on each of 8 devices"),
        Table("matmul check", ["device", "n", "max abs error", "tolerance", "result", "median ms", "GFLOP/s"], rows),
        ReplicaValues("gflops", [row[-1] for row in rows], CPUS),
        RunFinished("done", {"all_passed": True, "failed_devices": [], "gflops": {row[0]: row[-1] for row in rows}}),
    ]


def replica_matmul_events() -> list:
    """What replica-matmul reports with its default inputs: seed 004's product on every replica."""
    products = [[[22.0, 28.0], [49.0, 64.0]]] * 8
    return [
        Progress(1, 1, "run"),
        ReplicaValues("product", products, CPUS),
        Table(
            "replica-matmul: 2×3·3×2 on 8 replicas",
            ["replica", "device", "max abs error", "result"],
            [[index, name, 0.0, "pass"] for index, name in enumerate(CPUS)],
        ),
        ReplicaValues("max abs error", [0.0] * 8, CPUS),
        RunFinished("done", {"replicas": 8, "agree": True, "matches_reference": True, "max_abs_error": 0.0}),
    ]


def write_runs() -> None:
    shutil.rmtree(RUNS_DIR.parent, ignore_errors=True)
    RUNS_DIR.mkdir(parents=True)
    record_run(
        "20261117-094640-matmul-a1b2c3", "matmul", {"m": 1024, "k": 1024, "n": 1024}, matmul_events(), seconds=4.2
    )
    record_run(
        "20261117-095640-gradient-descent-d4e5f6",
        "gradient-descent",
        {"learning_rate": 0.1, "steps": 40},
        gradient_descent_events(),
        seconds=0.8,
    )
    record_run(
        "20261117-100640-train-0a1b2c", "train", {"source": "synthetic", "epochs": 3}, training_events(), seconds=95.0
    )
    record_run(
        "20261117-101640-train-3d4e5f",
        "train",
        {"source": "synthetic", "epochs": 3, "learning_rate": 0.01},
        training_events(),
        seconds=97.0,
    )


@pytest.fixture
def fixed_app(monkeypatch):
    """``fixed_app()`` → a dashboard that shows only what this module fixed."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    write_runs()
    runtime = Runtime(strategy=None, description=DESCRIPTION)
    settings = Settings(cpu_devices=8, runs_dir=RUNS_DIR, data_dir=RUNS_DIR.parent / "tfds", telemetry_interval=0)

    specs = registry()

    def engine(listener) -> EngineThread:
        handle = EngineThread(listener, settings, specs, lambda: runtime)
        handle.pid = ENGINE_PID  # on screen (Devices): the thread's is this test process's
        return handle

    def make() -> TpudashApp:
        return TpudashApp(settings, engine_factory=engine, host_check_provider=FixedHostCheck, job_specs=specs)

    yield make
    monkeypatch.delenv("TZ")
    time.tzset()
    shutil.rmtree(RUNS_DIR.parent, ignore_errors=True)


async def settled(pilot) -> None:
    """The runtime answered, the runs directory was read, the screen has drawn it."""
    app = pilot.app
    await app.runtime_settled.wait()
    await app.workers.wait_for_complete()
    await app.next_tick()
    await pilot.pause()


def opened_from_history(run_id: str, tab: str | None = None):
    async def run_before(pilot) -> None:
        await settled(pilot)
        await pilot.press("h")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        table = pilot.app.screen.query_one("#history-table")
        table.move_cursor(row=table.get_row_index(run_id))
        await pilot.press("enter")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.app.next_tick()
        if tab is not None:  # clicked, as a user picks a tab: the view stops choosing for them
            await pilot.click(f"#run-tabs Tab#--content-tab-{tab}")
        await pilot.app.next_tick()
        await pilot.pause()
        await plots_drawn(pilot.app.screen)  # plotext builds in a worker thread: its text has landed
        await pilot.pause()

    return run_before


def pressed(*keys: str):
    async def run_before(pilot) -> None:
        await settled(pilot)
        await pilot.press(*keys)
        await pilot.app.workers.wait_for_complete()
        await pilot.app.next_tick()
        await pilot.pause()
        await plots_drawn(pilot.app.screen)  # plotext builds in a worker thread: its text has landed
        await pilot.pause()

    return run_before


SCREENS = {
    "devices": pressed(),
    "jobs": pressed("j"),
    "train-form": pressed("j", "t"),
    "run-empty": pressed("v"),
    "history": pressed("h"),
    "help": pressed("question_mark"),
    "log": pressed("l"),
    "history-overlay": pressed("h", "space", "down", "space", "o"),
    "train-plots": opened_from_history("20261117-100640-train-0a1b2c"),
    "train-replicas": opened_from_history("20261117-100640-train-0a1b2c", "tab-replicas"),
    "train-results": opened_from_history("20261117-100640-train-0a1b2c", "tab-results"),
    "train-log": opened_from_history("20261117-100640-train-0a1b2c", "tab-log"),
    "gradient-descent": opened_from_history("20261117-095640-gradient-descent-d4e5f6"),
    "matmul-results": opened_from_history("20261117-094640-matmul-a1b2c3", "tab-results"),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("screen", SCREENS)
def test_screen_matches_its_snapshot(snap_compare, fixed_app, screen, size):
    assert snap_compare(fixed_app(), terminal_size=SIZES[size], run_before=SCREENS[screen])


REPLICA_MATMUL_RUN = "20261117-102640-replica-matmul-7a8b9c"


@pytest.mark.parametrize("size", SIZES)
def test_replica_matmuls_replicas_tab_matches_its_snapshot(snap_compare, fixed_app, size):
    """Its products whole, a row per replica (issue 38, item 13); a run of its own, so History's snapshots stay."""
    record_run(REPLICA_MATMUL_RUN, "replica-matmul", {}, replica_matmul_events(), seconds=1.5)
    assert snap_compare(fixed_app(), terminal_size=SIZES[size], run_before=opened_from_history(REPLICA_MATMUL_RUN))


ADVISED_RUN = "20261117-104640-train-8b9c0d"


@pytest.mark.parametrize("size", SIZES)
def test_a_runs_advice_tab_matches_its_snapshot(snap_compare, fixed_app, size):
    """The Advice tab and the header's MFU and hint, from the advice.json TpudashCallback wrote for the pitfalls
    script (``advice_reports/pitfalls.json``; issue 40): five rules fire, with the line to change."""
    from tpudash.advice.report import AdviceReport, write_report
    from tpudash.runs.backends import LocalRunFiles

    record_run(ADVISED_RUN, "train", {"source": "synthetic", "epochs": 3}, training_events(), seconds=95.0)
    stored = json.loads((Path(__file__).parent / "advice_reports" / "pitfalls.json").read_text())
    stored.update(run_id=ADVISED_RUN, updated=STARTED + 95.0)
    write_report(LocalRunFiles(RUNS_DIR / ADVISED_RUN), AdviceReport.from_json(stored))

    async def run_before(pilot) -> None:
        await opened_from_history(ADVISED_RUN)(pilot)
        for _ in range(400):  # read on a thread worker as the view opened
            if pilot.app.screen.view.advice is not None:
                break
            await pilot.pause(0.01)
        await pilot.press("a")
        await pilot.pause()

    assert snap_compare(fixed_app(), terminal_size=SIZES[size], run_before=run_before)


PROFILED_RUN = "20261117-103640-train-5e6f7a"
PROFILE_CAPTURE = "2026_11_28_08_27_43"


@pytest.mark.parametrize("size", SIZES)
def test_a_runs_profile_tab_matches_its_snapshot(snap_compare, fixed_app, size):
    """The Profile tab filled in from a real summary.json (an input-bound Keras fit on CPU; issue 39, item 3)."""
    record_run(PROFILED_RUN, "train", {"source": "synthetic", "epochs": 3}, training_events(), seconds=95.0)
    capture = RUNS_DIR / PROFILED_RUN / "profile" / "plugins" / "profile" / PROFILE_CAPTURE
    capture.mkdir(parents=True)
    (capture / "vm.xplane.pb").write_bytes(b"xplane")
    summary = Path(__file__).parent / "profile_summaries" / "input_bound.json"
    shutil.copy(summary, capture / "summary.json")
    assert snap_compare(
        fixed_app(), terminal_size=SIZES[size], run_before=opened_from_history(PROFILED_RUN, "tab-profile")
    )
