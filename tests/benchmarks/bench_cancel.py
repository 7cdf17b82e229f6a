"""Target 4: cancel ≤ 2 s + ε and quit ≤ 3 s for every job, in every state it can be caught in; before and after.

**After** (this checkout): the TUI under Pilot in this process, as users get
it: jobs run in the engine process the app starts; cancel is cooperative,
and after ``Settings.cancel_grace`` (2 s) the dashboard ends the engine and
records the run as cancelled. ε (0.5 s) is what comes on top of the grace
then: the key reaching the lane, the grace checked on the UI's 0.1 s tick,
the engine's exit and the record.

**Before** (commit ``BEFORE_COMMIT``, the app that ran jobs on thread
workers of its own process and imported TensorFlow itself): the same
measurement, by ``cancel_driver.py`` run as a script with that checkout
first on ``PYTHONPATH`` (exported with ``git archive`` into
``$TPUDASH_BENCH_BEFORE``, default ``/tmp/tpudash-before-<commit>``). There
the "engine starting" state needs a fresh process (the runtime is detected
once per process), so each such cell gets one; a job's other cells share
one, the runtime warm.

Every job of ``jobs.registry()`` × every state of ``cancel_driver.STATES`` ×
cancel and quit, one app each (``cancel_driver.measure_cell`` says what is
timed and how each state is caught), ``REPEATS`` rounds; a job's after and
before cells alternate, job by job, so load from other processes hits both
alike. A measurement whose run ended before it could be caught, or whose
job completed before the cancel reached it (replica-matmul is short even at
its largest size), is shown as such and left out of the figures. The table
(job × state → cancel s, quit s, before and after, the worst of the
rounds) is printed and written as Markdown to
``$TPUDASH_BENCH_CANCEL_TABLE`` (default in the temp dir). ``--quick``: one
job, two states, one round, this checkout only.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.benchmarks import cancel_driver
from tests.benchmarks.cancel_driver import ACTIONS, STATE_RUNNING, STATE_STARTING, STATES
from tests.benchmarks.harness import Result

BEFORE_COMMIT = "1228366"
EPSILON_SECONDS = 0.5
QUIT_TARGET_SECONDS = 3.0
BEFORE_PROCESS_TIMEOUT = 1800.0
QUICK_JOB = "gradient-descent"
# Every cell is measured this many times (one app each); the table shows the worst.
REPEATS = 2
REPO_ROOT = Path(__file__).resolve().parents[2]


def before_checkout() -> Path:
    """The old architecture's tree (``git archive BEFORE_COMMIT``), exported once."""
    path = Path(
        os.environ.get("TPUDASH_BENCH_BEFORE") or Path(tempfile.gettempdir()) / f"tpudash-before-{BEFORE_COMMIT}"
    )
    if not (path / "tpudash" / "app.py").exists():
        path.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", BEFORE_COMMIT], cwd=REPO_ROOT, check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(path)], input=archive.stdout, check=True)
    return path


def measure_after(cells: list[tuple[str, str, str]], runs_dir: Path) -> list[dict]:
    """This checkout's app, in this process, one app per cell."""
    measured = []
    for job, state, action in cells:
        try:
            measured.append(asyncio.run(cancel_driver.measure_cell(job, state, action, runs_dir)))
        except Exception as error:  # noqa: BLE001 - one cell's failure is a row of the table, not the end
            measured.append({"job": job, "state": state, "action": action, "error": f"{type(error).__name__}: {error}"})
    return measured


def measure_before(cells: list[tuple[str, str, str]], checkout: Path) -> list[dict]:
    """The old checkout's app, in driver processes: a fresh one per "engine starting" cell, one for the rest."""
    groups = [[cell] for cell in cells if cell[1] == STATE_STARTING]
    rest = [cell for cell in cells if cell[1] != STATE_STARTING]
    if rest:
        groups.append(rest)
    environment = dict(os.environ, PYTHONPATH=str(checkout), TF_CPP_MIN_LOG_LEVEL="2")
    measured = []
    for group in groups:
        command = [
            sys.executable,
            str(Path(cancel_driver.__file__)),
            "--runs-dir",
            tempfile.mkdtemp(prefix="tpudash-bench-cancel-before-"),
        ]
        for job, state, action in group:
            command += ["--cell", f"{job}/{state}/{action}"]
        try:
            completed = subprocess.run(
                command, cwd=checkout, env=environment, capture_output=True, text=True, timeout=BEFORE_PROCESS_TIMEOUT
            )
            lines = [
                line[len(cancel_driver.CELL_MARK) :]
                for line in completed.stdout.splitlines()
                if line.startswith(cancel_driver.CELL_MARK)
            ]
            found = [json.loads(line) for line in lines]
            failure = f"driver exited {completed.returncode}: {completed.stderr[-300:]!r}"
        except subprocess.TimeoutExpired:
            found, failure = [], f"driver still running after {BEFORE_PROCESS_TIMEOUT:g} s"
        for index, (job, state, action) in enumerate(group):
            measured.append(
                found[index] if index < len(found) else {"job": job, "state": state, "action": action, "error": failure}
            )
    return measured


def pressed(cell: dict) -> bool:
    """The key was pressed while the UI showed the run going (the cell has a latency)."""
    return cell.get("seconds") is not None


def caught(cell: dict) -> bool:
    """Pressed, and the run ended cancelled: a latency that counts."""
    return pressed(cell) and cell.get("status") == "cancelled"


def finished_anyway(cell: dict) -> bool:
    """Pressed, but the job completed before the cancel reached it (recorded done: the work was finished)."""
    return pressed(cell) and cell.get("status") == "done"


def wrong_outcome(cell: dict) -> str | None:
    """Why a pressed cell's end is wrong: its status, its record on disk, or the quit."""
    if not pressed(cell):
        return None
    status, record = cell.get("status"), cell.get("record")
    if status not in ("cancelled", "done"):
        return f"status {status}"
    # A run that never began (cancelled while the engine started) leaves no record, by design.
    never_began = record == "none" and status == "cancelled" and not cell.get("seen", {}).get("run_started")
    if record != status and not never_began:
        return f"status {status} but the record on disk says {record}"
    if cell.get("action") == "quit" and (
        cell.get("quit_worker") != "SUCCESS" or cell.get("return_code") not in (0, None)
    ):
        return f"quit worker {cell.get('quit_worker')}, exit code {cell.get('return_code')}"
    return None


def _key(cell: dict) -> tuple[str, str, str]:
    return cell["job"], cell["state"], cell["action"]


def _shown(cells: list[dict]) -> str:
    """One table cell: the worst caught repeat, marked; else why none counts."""
    if not cells:
        return "–"
    counted = [cell for cell in cells if caught(cell)]
    marks = ""
    if any(wrong_outcome(cell) for cell in cells):
        marks += "!"
    if not counted:
        if any(finished_anyway(cell) for cell in cells):
            return "finished first" + (f" {marks}" if marks else "")
        if any("error" in cell for cell in cells):
            return "error"
        return "ended first" + (f" {marks}" if marks else "")
    worst = max(counted, key=lambda cell: cell["seconds"])
    if worst.get("engine_killed"):
        marks = "k" + marks
    if any(cell.get("caught") not in ("as asked", "runtime not yet up") for cell in counted):
        marks += "*"
    if len(counted) < len(cells):
        marks += "+"
    return f"{worst['seconds']:.2f}" + (f" {marks}" if marks else "")


def markdown_table(
    jobs: list[str], states: tuple[str, ...], after: list[dict], before: list[dict], repeats: int
) -> str:
    """job × state → cancel s and quit s, before and after (worst of the repeats), with the footnotes the marks need."""

    def grouped(cells: list[dict]) -> dict:
        groups: dict = {}
        for cell in cells:
            groups.setdefault(_key(cell), []).append(cell)
        return groups

    after_by, before_by = grouped(after), grouped(before)
    lines = [
        "| job | state | cancel before | cancel after | quit before | quit after |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for job in jobs:
        for state in states:
            row = [job, state]
            for action in ACTIONS:
                row.append(_shown(before_by.get((job, state, action), [])))
                row.append(_shown(after_by.get((job, state, action), [])))
            lines.append("| " + " | ".join(row) + " |")
    worst_of = f"the worst of {repeats} measurements" if repeats > 1 else "one measurement"
    notes = [
        "",
        f"Seconds, {worst_of} per cell. Cancel: `c` → the run settled as cancelled; quit: `y` in the "
        "confirm dialog → the app exits. k: the engine was ended after the 2 s grace (the job had not stopped "
        "by itself). finished first: the job completed (recorded done) before the key could stop it; ended "
        "first: it ended before the state could be caught. +: some repeats of the cell did not count (finished "
        "or ended first).",
    ]
    starred = [
        cell for cell in after + before if caught(cell) and cell.get("caught") not in ("as asked", "runtime not yet up")
    ]
    if starred:
        described = sorted({f"{cell['job']} {cell['state']}: {cell['caught']}" for cell in starred})
        notes.append("*: " + "; ".join(described) + ".")
    wrong = [cell for cell in after + before if wrong_outcome(cell)]
    if wrong:
        notes.append(
            "!: "
            + "; ".join(
                f"{cell['job']} {cell['state']} {cell['action']} "
                f"({'after' if cell in after else 'before'}): {wrong_outcome(cell)}"
                for cell in wrong
            )
            + "."
        )
    errors = [cell for cell in after + before if "error" in cell]
    if errors:
        notes.append(
            "error: "
            + "; ".join(f"{cell['job']} {cell['state']} {cell['action']}: {cell['error']}" for cell in errors)
            + "."
        )
    return "\n".join(lines + notes) + "\n"


def _seconds(cells: list[dict], action: str) -> list[float]:
    return [cell["seconds"] for cell in cells if cell["action"] == action and caught(cell)]


def _worst(cells: list[dict], action: str) -> tuple[float, str]:
    candidates = [cell for cell in cells if cell["action"] == action and caught(cell)]
    if not candidates:
        return float("nan"), ""
    worst = max(candidates, key=lambda cell: cell["seconds"])
    return worst["seconds"], f"{worst['job']} / {worst['state']}"


def run(quick: bool) -> list[Result]:
    from jobs import registry
    from tpudash.config import Settings

    grace = Settings().cancel_grace
    cancel_target = grace + EPSILON_SECONDS
    jobs = [QUICK_JOB] if quick else list(registry())
    states = (STATE_STARTING, STATE_RUNNING) if quick else STATES
    missing = [job for job in jobs if job not in cancel_driver.JOB_PARAMS]
    if missing:
        raise RuntimeError(f"cancel_driver.JOB_PARAMS has no params for {', '.join(missing)}")
    repeats = 1 if quick else REPEATS
    runs_dir = Path(tempfile.mkdtemp(prefix="tpudash-bench-cancel-"))
    checkout = None if quick else before_checkout()
    after: list[dict] = []
    before: list[dict] = []
    for repeat in range(repeats):
        for job in jobs:
            cells = [(job, state, action) for state in states for action in ACTIONS]
            print(
                f"[cancel] round {repeat + 1} of {repeats}, {job}: {len(cells)} cells after"
                + ("" if checkout is None else ", then before"),
                file=sys.stderr,
                flush=True,
            )
            after.extend(dict(cell, repeat=repeat) for cell in measure_after(cells, runs_dir))
            if checkout is not None:
                before.extend(dict(cell, repeat=repeat) for cell in measure_before(cells, checkout))
    table = markdown_table(jobs, states, after, before, repeats)
    table_path = Path(
        os.environ.get("TPUDASH_BENCH_CANCEL_TABLE") or Path(tempfile.gettempdir()) / "tpudash-bench-cancel-latency.md"
    )
    table_path.write_text(table)
    print(table)
    print(f"(the table is in {table_path})")

    # An earlier benchmark of this run may have imported TensorFlow here; a
    # user's dashboard never has it (its collections would be longer).
    tensorflow_here = any(cell.get("tensorflow_in_dashboard") for cell in after)
    results = []
    for action, target in (("cancel", cancel_target), ("quit", QUIT_TARGET_SECONDS)):
        worst, where = _worst(after, action)
        before_worst, before_where = _worst(before, action)
        counted = len(_seconds(after, action))
        killed = sum(1 for cell in after if cell["action"] == action and caught(cell) and cell.get("engine_killed"))
        results.append(
            Result(
                benchmark="cancel",
                figure=f"{action} latency, worst of {counted} measurements ({len(jobs)} jobs × {len(states)} states"
                f"{f' × {repeats}' if repeats > 1 else ''}), engine process",
                value=worst,
                unit="s",
                baseline_name=f"before ({BEFORE_COMMIT}, jobs in the dashboard), worst" if before else "",
                baseline=before_worst if before else None,
                ratio=worst / before_worst if before and before_worst == before_worst and before_worst > 0 else None,
                target=f"≤ {target:g} s in every cell",
                met=counted > 0 and worst <= target,
                samples={
                    "after": after if action == "cancel" else [],
                    "before": before if action == "cancel" else [],
                    "table_markdown": table if action == "cancel" else "",
                },
                notes=f"worst after: {where}; before: {before_where or '-'}; engine ended after the grace in {killed} "
                f"of {counted} measurements; the dashboard (this process) had TensorFlow loaded: "
                f"{'yes' if tensorflow_here else 'no'}",
            )
        )
        after_seconds, before_seconds = _seconds(after, action), _seconds(before, action)
        if after_seconds:
            results.append(
                Result(
                    benchmark="cancel",
                    figure=f"{action} latency, median of the measurements",
                    value=statistics.median(after_seconds),
                    unit="s",
                    baseline_name="before, median" if before_seconds else "",
                    baseline=statistics.median(before_seconds) if before_seconds else None,
                    ratio=statistics.median(after_seconds) / statistics.median(before_seconds)
                    if before_seconds
                    else None,
                )
            )
    wrong = [cell for cell in after if wrong_outcome(cell)]
    errors = [cell for cell in after if "error" in cell]
    results.append(
        Result(
            benchmark="cancel",
            figure="measurements with a wrong end (status, record on disk, quit worker) or that failed",
            value=float(len(wrong) + len(errors)),
            unit=f"of {len(after)}",
            target="0",
            met=not wrong and not errors,
            notes="; ".join(
                [f"{cell['job']} {cell['state']} {cell['action']}: {wrong_outcome(cell)}" for cell in wrong]
                + [f"{cell['job']} {cell['state']} {cell['action']}: {cell['error']}" for cell in errors]
            ),
        )
    )
    return results
