"""Cancel and quit latency of one job caught in one state, driven through the TUI under Pilot.

``bench_cancel`` imports this for the checkout it belongs to (jobs run in the
engine process the app starts) and runs it as a script against an older
checkout for the "before" figures (``PYTHONPATH=<checkout> python
tests/benchmarks/cancel_driver.py --cell JOB/STATE/ACTION …``: there the app
ran jobs on thread workers of its own process and imported TensorFlow
itself). So it touches only what both apps offer: ``TpudashApp(Settings)``,
``run_test``, ``runtime_settled``, ``launch_by_name`` (the app's, or its session's), a live run's
``model`` and ``settled``, ``next_tick``, ``quit_worker``, ``exit``; the
engine only where there is one.

One measurement ("cell") is one app: it shows the run view once (so its
first composition does not hold the key), launches the job with params
that make it long (``JOB_PARAMS``), waits until the UI shows the run in the
state asked for, then presses the key, and times:

- **cancel**: ``c`` entering the app's queue → the run settled (its end read
  from disk, or recorded by the dashboard after ending its engine);
- **quit**: ``q`` is pressed right after the launch, so the confirm dialog
  is already up; ``y`` entering the queue → the app calling ``exit`` (the
  last thing its quit worker does).

The states, as the UI sees the run when the key is pressed:

- ``engine starting``: right after the launch, before the runtime has
  answered (the engine process importing TensorFlow; before: the app's
  own detection worker importing it);
- ``preparing``: the run's RunStarted has been read, no Progress yet (the
  job's data preparation; jobs that report Progress at once are caught
  with it already read, and the cell says so);
- ``running``: the first Progress has been read (most jobs report
  ``0 of N`` before tracing their step, so this is usually the tracing);
- ``stepping``: a Progress with at least one unit done has been read (the
  job's steady loop).

Each cell also records what the record on disk says (run.json's status;
none for a run that never began), whether and when the dashboard ended the
engine after the grace period, and when the engine process was gone; and
how long the key took to reach the lane (its cancel stamp, engine only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

STATE_STARTING = "engine starting"
STATE_PREPARING = "preparing"
STATE_RUNNING = "running"
STATE_STEPPING = "stepping"
STATES = (STATE_STARTING, STATE_PREPARING, STATE_RUNNING, STATE_STEPPING)
ACTIONS = ("cancel", "quit")

# Params that keep each job going long enough to be caught in each state
# (as text, as the forms and --set take them). replica-matmul cannot be made
# long (1024 is its largest size): its later states may end before the key.
JOB_PARAMS: dict[str, dict[str, str]] = {
    "matmul": {"m": "3072", "k": "3072", "n": "3072", "repeats": "20"},
    "replica-matmul": {"source": "random", "m": "1024", "k": "1024", "n": "1024"},
    "replica-dataset": {"n": "10000", "per_replica": "1"},
    "all-reduce": {"size_mb": "64", "repeats": "1000"},
    "gradient-descent": {"steps": "100000"},
    "train": {
        "dataset": "mnist",
        "source": "synthetic",
        "model": "light",
        "epochs": "1000",
        "limit_train": "10240",
        "limit_test": "512",
    },
    "dtensor-mlp": {"source": "synthetic", "epochs": "1000"},
}
APP_SIZE = (120, 40)
STATE_TIMEOUT = 120.0
ACTION_TIMEOUT = 120.0
ENGINE_EXIT_TIMEOUT = 60.0
CELL_MARK = "CANCEL-CELL "


def _observed(app, live) -> dict:
    """What the UI shows of the run now."""
    model = live.model
    progress = {unit: state.done for unit, state in model.progress.items()}
    return {
        "runtime_answered": app.runtime_settled.is_set(),
        "run_started": model.started is not None,
        "progress": progress,
        "status": model.status,
    }


def _in_state(state: str, app, live) -> bool:
    model = live.model
    if state == STATE_STARTING:
        return True  # checked at the launch, nothing to wait for
    if state == STATE_PREPARING:
        return model.started is not None
    if state == STATE_RUNNING:
        return bool(model.progress)
    return any(progress.done >= 1 for progress in model.progress.values())


def _caught(state: str, seen: dict) -> str:
    """How the run was caught, in words (for the table's footnotes)."""
    if state == STATE_STARTING:
        return "runtime not yet up" if not seen["runtime_answered"] else "runtime already up (state missed)"
    if state == STATE_PREPARING and seen["progress"]:
        return "RunStarted read with a Progress already (the job reports at once)"
    if state == STATE_RUNNING and any(done >= 1 for done in seen["progress"].values()):
        return "first Progress read with units already done"
    return "as asked"


def _press(app, key: str) -> tuple[float, float]:
    """Hand a key to the app as a terminal would (the driver's queue); the time just before (perf, monotonic)."""
    from textual import events

    event = events.Key(key, key)
    event.set_sender(app)  # as pilot.press does
    started, monotonic = time.perf_counter(), time.monotonic()
    app._driver.send_message(event)
    return started, monotonic


async def _tick(app) -> None:
    await _within(app.next_tick(), STATE_TIMEOUT, "the UI's next tick")


async def _within(awaitable, seconds: float, what: str):
    """``asyncio.wait_for`` whose timeout says what was awaited."""
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except asyncio.TimeoutError:
        raise TimeoutError(f"no {what} within {seconds:g} s") from None


def _run_json_status(runs_dir: Path, run_id: str) -> str:
    path = runs_dir / run_id / "run.json"
    if not (runs_dir / run_id).exists():
        return "none"
    try:
        return str(json.loads(path.read_text()).get("status"))
    except (OSError, ValueError) as error:
        return f"unreadable ({type(error).__name__})"


def _engine_of(app):
    """The engine process's handle, where the app has one (the older app ran jobs in its own process)."""
    lane = getattr(getattr(app, "session", app), "_lane", None)
    engine = getattr(lane, "engine", None)
    return engine if getattr(engine, "_process", None) is not None else None


class EngineExitClock:
    """Stamps the moment the dashboard ends an engine (``kill``) and the moment its process exits."""

    def __init__(self, engine):
        self.engine = engine
        self.killed_at: float | None = None
        self.exited_at: float | None = None
        original_kill = engine.kill

        def stamped_kill(reason: str) -> None:
            if self.killed_at is None:
                self.killed_at = time.perf_counter()
            original_kill(reason)

        engine.kill = stamped_kill
        self._thread = threading.Thread(target=self._wait, name="bench-engine-exit", daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        self.engine._process.wait()
        self.exited_at = time.perf_counter()

    def join(self, timeout: float) -> bool:
        """Wait for the exit; an engine still there after ``timeout`` is killed (False)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.engine._process.kill()
            self._thread.join()
            return False
        return True


async def measure_cell(job: str, state: str, action: str, runs_dir: Path, params: dict | None = None) -> dict:
    """One app, one launch of ``job``, caught in ``state``, ended by ``action``; what it took."""
    from tpudash.config import Settings
    from tpudash.tui.app import TpudashApp

    if state not in STATES or action not in ACTIONS:
        raise ValueError(f"unknown state {state!r} or action {action!r}")
    runs_dir = Path(runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "job": job,
        "state": state,
        "action": action,
        "seconds": None,
        "caught": None,
        "status": None,
        "record": None,
        "handled_seconds": None,
        "engine_killed": None,
        "kill_seconds": None,
        "engine_exit_seconds": None,
        "closed_seconds": None,
        "source": str(Path(sys.modules["tpudash"].__file__).parent.parent),
    }
    app = TpudashApp(Settings(runs_dir=runs_dir))
    exited = asyncio.Event()
    exit_called: list[float] = []
    original_exit = app.exit

    def stamped_exit(*args, **kwargs):
        if not exit_called:
            exit_called.append(time.perf_counter())
            exited.set()
        return original_exit(*args, **kwargs)

    app.exit = stamped_exit
    engine_clock: EngineExitClock | None = None
    pressed_at: float | None = None
    async with app.run_test(size=APP_SIZE) as pilot:
        if state != STATE_STARTING:
            # The Devices screen (shown at start) starts the engine.
            await _within(app.runtime_settled.wait(), STATE_TIMEOUT, "answer about the runtime")
            if app.runtime is None:
                raise RuntimeError(f"no runtime: {app.runtime_error}")
        # The run view is composed once before the launch, as after a user's
        # first run: its first composition (0.2–0.5 s) would otherwise hold
        # a key pressed just after the launch, whatever the job does.
        _press(app, "v")
        while type(app.screen).__name__ != "RunScreen":
            await _tick(app)
        launcher = getattr(app, "session", app)  # the older app launched itself; this one through its session
        live = launcher.launch_by_name(job, params if params is not None else JOB_PARAMS[job])
        if live is None:
            raise RuntimeError(f"the TUI refused to launch {job}: {app.notices[-1:]}")
        result["run_id"] = live.run_id
        if action == "quit":
            _press(app, "q")
            while type(app.screen).__name__ != "ConfirmScreen":
                await _tick(app)
        deadline = time.perf_counter() + STATE_TIMEOUT
        while not _in_state(state, app, live) and not live.settled.is_set():
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{job} never reached {state!r}: {_observed(app, live)}")
            await _tick(app)
        seen = _observed(app, live)
        result["seen"] = seen
        if live.settled.is_set():
            result["caught"] = f"ended ({live.model.status}) before it could be caught"
            result["status"] = live.model.status
            if action == "quit":
                _press(app, "n")
            await pilot.pause()
        else:
            result["caught"] = _caught(state, seen)
            engine = _engine_of(app)
            if engine is not None:
                engine_clock = EngineExitClock(engine)
            if action == "cancel":
                pressed_at, pressed_monotonic = _press(app, "c")
                await _within(live.settled.wait(), ACTION_TIMEOUT, "end of the run after c")
                result["seconds"] = time.perf_counter() - pressed_at
            else:
                pressed_at, pressed_monotonic = _press(app, "y")
                await _within(exited.wait(), ACTION_TIMEOUT, "exit after y")
                result["seconds"] = exit_called[0] - pressed_at
            result["status"] = live.model.status
            requested = getattr(live, "cancel_requested_at", None)  # the lane's monotonic stamp (engine only)
            if requested is not None:
                result["handled_seconds"] = requested - pressed_monotonic
            if engine is not None:
                result["engine_killed"] = engine.kill_reason is not None
    if pressed_at is not None:
        result["closed_seconds"] = time.perf_counter() - pressed_at
    if action == "quit" and result["seconds"] is not None:
        worker = app.quit_worker
        result["quit_worker"] = None if worker is None else str(worker.state.name)
        result["return_code"] = app.return_code
    if engine_clock is not None:
        if engine_clock.join(ENGINE_EXIT_TIMEOUT) and pressed_at is not None:
            result["engine_exit_seconds"] = engine_clock.exited_at - pressed_at
            if engine_clock.killed_at is not None:
                result["kill_seconds"] = engine_clock.killed_at - pressed_at
        else:
            result["engine_exit_seconds"] = None
            result["engine_outlived_app"] = True
    result["record"] = _run_json_status(runs_dir, result["run_id"])
    result["tensorflow_in_dashboard"] = "tensorflow" in sys.modules
    return result


def parse_cell(text: str) -> tuple[str, str, str]:
    """``JOB/STATE/ACTION`` (the state may hold a space: ``train/engine starting/quit``)."""
    job, state, action = text.split("/")
    return job, state, action


def main(argv: list[str] | None = None) -> int:
    """Measure the cells given, one app each, in order; one ``CANCEL-CELL {json}`` line per cell on stdout."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--cell", action="append", required=True, type=parse_cell, metavar="JOB/STATE/ACTION")
    parser.add_argument("--runs-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="tpudash-bench-cancel-"))
    code = 0
    for job, state, action in args.cell:
        try:
            measured = asyncio.run(measure_cell(job, state, action, runs_dir))
        except Exception as error:  # noqa: BLE001 - one cell's failure is reported, the rest still run
            code = 1
            measured = {"job": job, "state": state, "action": action, "error": f"{type(error).__name__}: {error}"}
        print(CELL_MARK + json.dumps(measured, default=str), flush=True)
    return code


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TFDS_DISABLE_GCS", "1")
    sys.exit(main())
