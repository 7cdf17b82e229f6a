"""The dashboard's train form with workers = 2: the run is watched live, lists both workers, ends done; or is cancelled.

A user presses ``t``, fills the train form (a small synthetic set), sets
workers to 2 and presses enter. The dashboard's engine launches two
``tpudash run train --worker-index I --cluster …`` processes on loopback
ports (``tpudash.engine.cluster``); the chief writes the run, and the Run
view plots it live as it does a run on one worker, with a Workers tab that
lists worker 0 and worker 1 from their heartbeats. Cancel (``c``) stops both
worker processes and the run ends cancelled.

The engine is a thread of this process (``EngineThread``) whose runtime is a
description only: a run on two workers needs no TensorFlow in the engine, so
the only TensorFlow processes are the two workers (at most two at once, CI's
two cores). Every wait is on the app's own state, tick by tick, bounded.
"""

from __future__ import annotations

import os
import time

import psutil

from screens.jobs import JobsScreen
from tests.functional.conftest import run_settled, runtime_ready, shown_live, type_into, until
from tpudash.accel.description import LogicalDeviceInfo, Runtime, RuntimeDescription
from tpudash.config import Settings
from tpudash.engine.inthread import EngineThread
from tpudash.tui.app import TpudashApp
from tpudash.tui.workers import COLUMNS, WorkersTable

TASK, HOST, PROGRESS, STEP_TIME, HEARTBEAT, STATE = (
    COLUMNS.index(name) for name in ("task", "host", "progress", "step time", "heartbeat", "state")
)

SIZE = (160, 48)
START_SECONDS = 90.0
"""The longest two workers may take to import TensorFlow, agree on the cluster and plot a first step (2 loaded cores)."""
RUN_SECONDS = 120.0
STOP_SECONDS = 15.0
"""A cancel stops both workers within this: SIGTERM, then SIGKILL after the launcher's grace."""
SHORT_TRAIN = {"epochs": "3", "batch_per_replica": "16", "limit_train": "2048", "limit_test": "256"}
LONG_TRAIN = {"epochs": "200", "batch_per_replica": "16", "limit_train": "512", "limit_test": "128"}

# What the engine says it runs on: the workers set up their own TensorFlow; the engine needs none.
CPU_DESCRIPTION = RuntimeDescription(
    kind="CPU",
    strategy="MirroredStrategy",
    num_replicas=1,
    devices=[LogicalDeviceInfo(0, "/job:localhost/replica:0/task:0/device:CPU:0", "CPU")],
)


def dashboard(tmp_path) -> TpudashApp:
    settings = Settings(runs_dir=tmp_path / "runs", data_dir=tmp_path / "tfds", telemetry_interval=0)
    runtime = Runtime(strategy=None, description=CPU_DESCRIPTION)

    def engine(listener) -> EngineThread:
        from jobs import registry

        return EngineThread(listener, settings, dict(registry()), lambda: runtime)

    return TpudashApp(settings, engine_factory=engine)


async def launch_from_the_train_form(pilot, params: dict[str, str]):
    """``t``, a synthetic source, ``params`` and workers = 2 typed as a user types them, enter; the live run."""
    app = pilot.app
    await runtime_ready(pilot)
    await pilot.press("t")
    assert isinstance(app.screen, JobsScreen)
    form = app.screen.current_form
    assert form.spec.name == "train"
    form.set_value("source", "synthetic")
    for name, value in params.items():
        await type_into(pilot, form.field(name).input, value)
    await type_into(pilot, form.field("workers").input, "2")
    await pilot.press("enter")  # in the workers field, typed last
    live = shown_live(app)
    assert live is not None, [text for _, _, text in app.notices]
    assert live.model.job == "train" and live.model.params.get("workers") == 2
    return live


def launched_workers(run_id: str) -> dict[int, psutil.Process]:
    """The worker processes the engine started for ``run_id``, by ``--worker-index``."""
    workers = {}
    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            arguments = child.cmdline()
        except psutil.Error:
            continue  # ended since the listing
        if "--worker-index" in arguments and run_id in arguments:
            workers[int(arguments[arguments.index("--worker-index") + 1])] = child
    return workers


def process_address(process: psutil.Process) -> str:
    """The cluster address a launched worker serves on (its place in ``--cluster``)."""
    arguments = process.cmdline()
    addresses = arguments[arguments.index("--cluster") + 1].split(",")
    return addresses[int(arguments[arguments.index("--worker-index") + 1])]


def workers_rows(view) -> dict[str, list[str]]:
    """The Workers tab's rows as drawn, by worker index."""
    rows = {}
    for table in view.query(WorkersTable):
        for row_key in table.rows:
            cells = [str(cell) for cell in table.get_row(row_key)]
            rows[cells[0]] = cells
    return rows


async def test_train_on_two_workers_from_the_form_plots_live_lists_both_workers_and_ends_done(tmp_path):
    app = dashboard(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        live = await launch_from_the_train_form(pilot, SHORT_TRAIN)
        entered = time.monotonic()
        view = app.screen.view

        def loss_plotted() -> bool:
            plot = view.plot_for("loss")
            return plot is not None and plot.points_drawn > 0

        await until(pilot, loss_plotted, timeout=START_SECONDS)
        first_point = time.monotonic() - entered
        assert live.model.status == "running"
        drawn_mid_run = view.plot_for("loss").points_drawn
        workers = launched_workers(live.run_id)
        assert set(workers) == {0, 1}, workers
        # Both workers beat: the Workers tab lists them, each with its address and heartbeat.
        await until(pilot, lambda: {"0", "1"} <= set(workers_rows(view)), timeout=RUN_SECONDS)
        rows = workers_rows(view)
        for index in ("0", "1"):
            assert rows[index][HOST] == process_address(workers[int(index)]), rows
            assert rows[index][HEARTBEAT] == "now" or rows[index][HEARTBEAT].endswith(" ago"), rows
        assert (rows["0"][TASK], rows["1"][TASK]) == ("chief", "worker"), rows

        await run_settled(pilot, live, timeout=RUN_SECONDS)
        wall = time.monotonic() - entered
        model = live.model
        assert model.status == "done", model.error
        # The chief's metrics are the run's: the loss plot grew as training went on, and validation came in.
        assert {"val_loss", "val_accuracy", "test_accuracy"} <= set(model.last_metrics()), model.last_metrics()
        assert view.plot_for("loss").points_drawn > drawn_mid_run
        # Each worker's last heartbeat says it is done, every step of its shard taken.
        await until(pilot, lambda: all(row[STATE] == "done" for row in workers_rows(view).values()), RUN_SECONDS)
        rows = workers_rows(view)
        assert set(rows) == {"0", "1"}, rows
        assert rows["0"][PROGRESS] == rows["1"][PROGRESS] and rows["0"][PROGRESS].startswith("step "), rows
        # The chief's record ends the run; the workers leave the cluster and exit right after.
        _, alive = psutil.wait_procs(list(workers.values()), timeout=STOP_SECONDS)
        assert not alive, f"still running after the run ended: {alive}"
        print(f"\nform on 2 workers: first plotted point {first_point:.1f} s after enter, run done in {wall:.1f} s")
        for index, row in sorted(rows.items()):
            print(f"worker {index}: {row[PROGRESS]}, {row[STEP_TIME]} per step")


async def test_cancel_of_a_run_on_two_workers_stops_both_worker_processes_and_ends_cancelled(tmp_path):
    app = dashboard(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        live = await launch_from_the_train_form(pilot, LONG_TRAIN)
        # A step done means both workers train (a collective step needs every worker).
        await until(pilot, lambda: "step" in live.model.progress, timeout=START_SECONDS)
        workers = launched_workers(live.run_id)
        assert set(workers) == {0, 1}, workers
        await pilot.press("c")
        cancelled_at = time.monotonic()
        await run_settled(pilot, live, timeout=STOP_SECONDS)
        _, alive = psutil.wait_procs(list(workers.values()), timeout=STOP_SECONDS)
        took = time.monotonic() - cancelled_at
        assert not alive, f"still running after the cancel: {alive}"
        assert live.model.status == "cancelled", live.model.error
        assert app.session.store.info(live.run_id).status == "cancelled"  # History says so too
        # Each worker's last heartbeat says how it ended, and the Workers tab shows it: a worker killed at the
        # end of the grace (waiting in a collective on a chief already gone) is said cancelled by the launcher.
        view = app.screen.view
        try:
            await until(
                pilot,
                lambda: [row[STATE] for _, row in sorted(workers_rows(view).items())] == ["cancelled"] * 2,
                STOP_SECONDS,
            )
        except AssertionError as timed_out:
            raise AssertionError(f"{timed_out}; the Workers tab shows {workers_rows(view)}") from None
        print(f"\ncancel to both workers stopped and the run cancelled: {took:.1f} s")
