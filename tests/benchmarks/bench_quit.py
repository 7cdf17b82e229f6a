"""Issue 26: quit with a job running, as a user feels it: ``q``, ``y``, until the terminal is back and the engine gone.

The dashboard (``tests.benchmarks.quit_driver``: ``TpudashApp`` as ``tpudash``
runs it, the engine a process) runs in a detached tmux session, 160×48, with
a runs directory and an engine lock of its own. It launches a train run
(synthetic MNIST, light model, ``loop=fit``) and says when the run is past
its first epoch. Then, like a user: ``q`` (the pane shows the confirm
dialog), ``y``, and the clock runs until the dashboard process has exited
and the engine process is gone. The run must be recorded as cancelled.

Reported: the median (and worst) of ``y`` → both processes gone, ``y`` → the
dashboard gone, and where the time went (the driver's stamps: the run's end
recorded, ``exit()``, unmount, ``run()`` returned, the last atexit hook).
The README promises 2.2 s (the 2 s cancel grace plus the dashboard's own
steps); the issue measured 3.3 s on a loaded machine.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.benchmarks.harness import Result, percentile
from tests.benchmarks.quit_driver import QUIT_WHEN_VARIABLE
from tests.benchmarks.tmux import TmuxTerminal, tmux_available, wait_until_gone

PROJECT = Path(__file__).resolve().parents[2]
TARGET_SECONDS = 2.2
READY_TIMEOUT = 300.0
QUIT_TIMEOUT = 30.0
DIALOG_TEXT = "Cancel and quit"


def measure_once(when: str = "stepping", size: tuple[int, int] = (160, 48)) -> dict:
    """One dashboard, one train run, one quit: seconds from ``y`` to each step, and the run's recorded status."""
    scratch = Path(tempfile.mkdtemp(prefix="tpudash-bench-quit-"))
    state_file = scratch / "state.json"
    environment = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(scratch)),
        "TERM": "xterm-256color",
        "PYTHONPATH": str(PROJECT),
        "TPUDASH_RUNS_DIR": str(scratch / "runs"),
        "TPUDASH_ENGINE_LOCK": str(scratch / "engine.lock"),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TFDS_DISABLE_GCS": "1",
        QUIT_WHEN_VARIABLE: when,
    }
    argv = [sys.executable, "-m", "tests.benchmarks.quit_driver", str(state_file)]
    with TmuxTerminal(argv, environment, size=size, cwd=str(PROJECT)) as terminal:
        deadline = time.perf_counter() + READY_TIMEOUT
        while not state_file.exists():
            if terminal.exited() or time.perf_counter() > deadline:
                raise RuntimeError(
                    f"the train run was not stepping (the pane's command ended, or {READY_TIMEOUT:g} s passed):\n{terminal.capture()}"
                )
            time.sleep(0.05)
        state = json.loads(state_file.read_text())
        terminal.send("q")
        terminal.wait_for(lambda text: DIALOG_TEXT in text, QUIT_TIMEOUT, "the quit dialog")
        confirmed = time.perf_counter()
        confirmed_wall = time.time()
        terminal.send("y")
        dashboard_gone = wait_until_gone(state["dashboard_pid"], QUIT_TIMEOUT)
        engine_gone = wait_until_gone(state["engine_pid"], QUIT_TIMEOUT) if state["engine_pid"] else dashboard_gone
    run_file = scratch / "runs" / state["run_id"] / "run.json"
    status = json.loads(run_file.read_text()).get("status") if run_file.exists() else None
    phases = {}
    phases_file = state_file.with_name(state_file.name + ".phases")
    if phases_file.exists():
        for line in phases_file.read_text().splitlines():
            stamp = json.loads(line)
            phases.setdefault(stamp["phase"], stamp["time"] - confirmed_wall)
    return {
        "seconds": max(dashboard_gone, engine_gone) - confirmed,
        "dashboard_seconds": dashboard_gone - confirmed,
        "engine_seconds": engine_gone - confirmed,
        "status": status,
        "phases": phases,
    }


def run(quick: bool) -> list[Result]:
    if not tmux_available():
        raise RuntimeError("tmux is not installed: this benchmark drives a real terminal")
    rounds = 1 if quick else 5
    measured = [measure_once() for _ in range(rounds)]
    total = [item["seconds"] for item in measured]
    dashboard = [item["dashboard_seconds"] for item in measured]
    statuses = [item["status"] for item in measured]
    phase_names = list(dict.fromkeys(name for item in measured for name in item["phases"]))
    phases = ", ".join(
        f"{name} {statistics.median([item['phases'][name] for item in measured if name in item['phases']]):.2f}"
        for name in phase_names
    )
    wrong = sum(1 for status in statuses if status != "cancelled")
    return [
        Result(
            "quit",
            f"y → dashboard exited and engine gone, train running (tmux, median of {rounds})",
            statistics.median(total),
            "s",
            target=f"≤ {TARGET_SECONDS:g} s",
            met=statistics.median(total) <= TARGET_SECONDS,
            samples={"seconds": total, "dashboard_seconds": dashboard, "statuses": statuses, "phases": measured},
            notes=f"worst {max(total):.2f} s; y → dashboard exited: median {statistics.median(dashboard):.2f} s, "
            f"p95 {percentile(dashboard, 0.95):.2f} s; median seconds after y: {phases}",
        ),
        Result(
            "quit",
            "quits whose run was not recorded as cancelled",
            float(wrong),
            f"of {rounds}",
            target="0",
            met=wrong == 0,
            samples={"statuses": statuses},
        ),
    ]
