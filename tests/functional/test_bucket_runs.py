"""Runs in a bucket, end to end, against loopback GCS and S3 emulators (tests/object_stores.py).

What a user does and sees with ``--runs-dir gs://…`` / ``s3://…``: ``tpudash
run`` prints its figure and ``tpudash runs`` lists the run done; a ``fit``
with ``TpudashCallback(runs_dir="gs://…")`` in its own process is followed
live by ``tpudash watch`` from another process and by the dashboard. And
the faults of a network: the store going away mid-run and coming back
(training is never held, the run ends up whole, its log says what
happened), a writer killed -9 (its run stays readable and turns stale), two
writers on one run (neither overwrites the other), and a finish while the
store is away (bounded; the run is kept locally, and the ``tpudash copy``
line it prints completes it in the store).

The stores run in this process's threads; a child process reaches them
through ``environment()``. A child's gcsfs call against a stopped store
retries for about half a minute (the fixture can lower that only in this
process), so every outage here is of a writer in this process.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from textual.widgets import Static

import tpudash
from jobs.events import Log, Metric, RunFinished, RunStarted
from screens.run_detail import RunDetailScreen
from tests.conftest import REPO_ROOT
from tests.functional.conftest import SIZE, until
from tpudash.accel.description import LogicalDeviceInfo, Runtime, RuntimeDescription
from tpudash.cli import main as cli
from tpudash.config import Settings
from tpudash.engine.inthread import EngineThread
from tpudash.runs import liveness
from tpudash.runs.layout import new_run_id
from tpudash.runs.segments import segment_order
from tpudash.runs.store import RunStore
from tpudash.runs.uploader import SEAL_SECONDS, StoreRecorder, default_spill_dir

pytest_plugins = ["tests.object_stores"]  # gcs_store, s3_store: loopback emulators

# What `tpudash run gradient-descent` prints (tests/unit/test_cli.py, the README).
GRADIENT_DESCENT_FIGURE = "0.0022596875205636024 @ [0.01152921 0.04611686]"
# What a user's shell would not have: the libtpu settings this test process keeps for itself (tests/conftest.py).
USER_UNSET = ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_LOAD_LIBRARY", "TPU_SKIP_MDS_QUERY")
# A TensorFlow import, a job or a fit, on a loaded 2-core machine.
CHILD_TIMEOUT = 180.0
# Anything a writer's threads do against a running store.
STORE_TIMEOUT = 30.0
# A training step's own computation, between two records.
STEP_SECONDS = 0.005
# The longest a record() call may take while the store is away: far under one flush (SEAL_SECONDS).
MAX_RECORD_SECONDS = SEAL_SECONDS / 4
# The finish's wait for a store that is away, shortened from its 10 s (the bound is what is tested, not its size).
FINISH_WAIT_SECONDS = 2.0


def child_environment() -> dict[str, str]:
    """This test's environment (the store's endpoint and settings included), as a user's shell has it."""
    return {key: value for key, value in os.environ.items() if key not in USER_UNSET}


def tpudash_child(*argv: str, stderr_file: Path) -> subprocess.CompletedProcess:
    """``tpudash ARGV`` in a fresh process, as a user runs it; its stderr kept in ``stderr_file``."""
    with stderr_file.open("w") as stderr:
        return subprocess.run(
            [sys.executable, "-m", "tpudash", *argv],
            stdout=subprocess.PIPE,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd=REPO_ROOT,
            env=child_environment(),
            timeout=CHILD_TIMEOUT,
        )


def start_child(argv: list[str], stderr_file: Path) -> subprocess.Popen:
    """A process of ours (a user's script, ``tpudash watch``) talking through pipes; stderr into a file."""
    with stderr_file.open("w") as stderr:
        return subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            env=child_environment(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )


def line_from(process: subprocess.Popen, timeout: float = CHILD_TIMEOUT) -> str:
    """The child's next line on stdout ("" at its end); AssertionError if none comes within ``timeout`` s."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not lines:
        raise AssertionError(f"no line from {process.args} within {timeout:g} s")
    return lines[0].strip()


def end_child(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(CHILD_TIMEOUT)


def wait_until(condition, what: str, timeout: float = STORE_TIMEOUT) -> None:
    """Read the store until ``condition`` holds, for at most ``timeout`` s: for a writer in another process,
    whose only trace here is what it put in the store (as for any reader of a bucket)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        threading.Event().wait(0.05)


def steps_of(runs: RunStore, run_id: str, metric: str = "loss") -> list[int]:
    """The steps of ``metric`` in the run as the store has it, in the order read."""
    return [event.step for _, event in runs.load(run_id).events if isinstance(event, Metric) and event.name == metric]


def steps_so_far(runs: RunStore, run_id: str) -> list[int]:
    """``steps_of``, or none while the run is not in the store yet."""
    try:
        return steps_of(runs, run_id)
    except KeyError:
        return []


def log_of(runs: RunStore, run_id: str) -> list[str]:
    return [event.text for _, event in runs.load(run_id).events if isinstance(event, Log)]


# -- Show: `tpudash run` and `tpudash runs` with the runs directory in a bucket -------------------------


@pytest.mark.slow  # long: CI runs it after the default suite (pytest -m slow)
def test_tpudash_run_into_a_bucket_prints_the_figure_and_tpudash_runs_lists_it_done(gcs_store, tmp_path):
    # s3:// is the same code under another client: the outage and two-writer tests below run it against moto.
    url = gcs_store.url("tpudash/runs")

    ran = tpudash_child("run", "gradient-descent", "--runs-dir", url, stderr_file=tmp_path / "run.err")
    assert ran.returncode == 0, (tmp_path / "run.err").read_text()
    assert GRADIENT_DESCENT_FIGURE in ran.stdout

    listed = tpudash_child("runs", "--runs-dir", url, "--json", stderr_file=tmp_path / "runs.err")
    assert listed.returncode == 0, (tmp_path / "runs.err").read_text()
    [run] = json.loads(listed.stdout)
    assert (run["job"], run["status"], run["path"]) == ("gradient-descent", "done", f"{url}/{run['run_id']}")
    assert run["final_metrics"]["loss"] == pytest.approx(0.0022596875205636024)
    # The store took everything: nothing is left waiting on this host.
    assert not list(default_spill_dir().glob("*"))


# -- Show: a user's fit into a bucket, watched live by `tpudash watch` and by the dashboard -----------


async def read_line(process: subprocess.Popen) -> str:
    return (await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), CHILD_TIMEOUT)).strip()


async def read_events_until(process: subprocess.Popen, seen: list[dict], event_type: str) -> dict:
    """Read ``tpudash watch --json`` lines into ``seen`` until an event of ``event_type``; that event."""
    while True:
        line = await read_line(process)
        if not line:
            raise AssertionError(f"tpudash watch ended before a {event_type} event; it printed {seen}")
        seen.append(json.loads(line))
        if seen[-1]["type"] == event_type:
            return seen[-1]


# What the dashboard's engine says it runs on: nothing is launched here, so no TensorFlow is set up.
CPU_DESCRIPTION = RuntimeDescription(
    kind="CPU",
    strategy="MirroredStrategy",
    num_replicas=1,
    devices=[LogicalDeviceInfo(0, "/job:localhost/replica:0/task:0/device:CPU:0", "CPU")],
    simulated=True,
)


def dashboard_on(runs_dir: str, tmp_path: Path):
    """A TpudashApp whose runs directory is ``runs_dir``, its engine a thread that never loads TensorFlow."""
    from tpudash.tui.app import TpudashApp

    settings = Settings(runs_dir=runs_dir, data_dir=tmp_path / "tfds", telemetry_interval=0)
    runtime = Runtime(strategy=None, description=CPU_DESCRIPTION)

    def engine(listener) -> EngineThread:
        return EngineThread(listener, settings, {}, lambda: runtime)

    return TpudashApp(settings, engine_factory=engine, job_specs={})


@pytest.mark.slow  # long: CI runs it after the default suite (pytest -m slow)
async def test_a_users_fit_into_a_bucket_is_watched_live_by_tpudash_watch_and_by_the_dashboard(gcs_store, tmp_path):
    url = gcs_store.url("runs")
    fit = start_child([sys.executable, "-m", "tests.functional.bucket_fit", url], tmp_path / "fit.err")
    watch: subprocess.Popen | None = None
    try:
        held = await read_line(fit)
        assert held.startswith("epoch 1 of "), (tmp_path / "fit.err").read_text()
        run_id = held.rsplit(" ", 1)[1]

        # `tpudash watch` with no run named follows the newest live run: the fit's, held after its first epoch.
        watch = start_child(
            [sys.executable, "-m", "tpudash", "watch", "--runs-dir", url, "--json"], tmp_path / "watch.err"
        )
        watched: list[dict] = []
        await read_events_until(watch, watched, "metric")
        assert watched[0]["type"] == "run_started" and watched[0]["run_id"] == run_id

        app = dashboard_on(url, tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            # The run appears by itself, and the dashboard says so.
            await until(pilot, lambda: app.session.live_on_disk, timeout=STORE_TIMEOUT)
            assert [info.run_id for info in app.session.live_on_disk] == [run_id]
            assert any(
                "A run is live: bucket-fit, from model.fit with TpudashCallback" in text for _, _, text in app.notices
            )
            await pilot.press("w")
            detail = app.screen
            assert isinstance(detail, RunDetailScreen) and detail.run_id == run_id
            await until(pilot, lambda: detail.loaded and detail.view.model.final_metrics.get("val_loss") is not None)
            model = detail.view.model
            assert model.status == "running" and model.progress["epoch"].done == 1
            source = str(detail.query_one("#detail-source", Static).content)
            assert "● live  written by model.fit with TpudashCallback" in source

            fit.stdin.write("go on\n")
            fit.stdin.flush()
            await until(pilot, lambda: detail.view.model.status == "done", timeout=CHILD_TIMEOUT)
            assert model.progress["epoch"].done == 3

        finished = await read_events_until(watch, watched, "run_finished")
        assert finished["status"] == "done"
        assert watch.wait(CHILD_TIMEOUT) == 0, (tmp_path / "watch.err").read_text()
        assert sum(event["type"] == "metric" for event in watched) > 1
        assert await read_line(fit) == f"done {run_id}"
        assert fit.wait(CHILD_TIMEOUT) == 0, (tmp_path / "fit.err").read_text()
    finally:
        for process in (fit, watch):
            if process is not None:
                end_child(process)


# -- Faults: the store goes away mid-run and comes back ----------------------------------------------


def spilled_segments(run_dir: Path) -> list[Path]:
    """Segments the writer keeps on this host because the store did not take them."""
    return sorted((run_dir / "events").glob("*.jsonl"))


@pytest.mark.parametrize("store_name", ["gcs_store", "s3_store"])
def test_a_store_that_goes_away_mid_run_never_holds_training_and_gets_every_event_once_when_back(
    store_name, request, capsys
):
    store = request.getfixturevalue(store_name)
    url = store.url("runs")
    run = tpudash.record("outage", runs_dir=url)
    writer = run._recorder  # the store's writer under tpudash.record: its own signals say when it got there
    assert isinstance(writer, StoreRecorder)
    record_seconds: list[float] = []
    stop_training = threading.Event()

    def train() -> None:
        step = 0
        while not stop_training.is_set():
            started = time.perf_counter()
            run.metric("loss", 1.0 / (step + 1), step=step)
            record_seconds.append(time.perf_counter() - started)
            step += 1
            stop_training.wait(STEP_SECONDS)  # the step's own computation

    trainer = threading.Thread(target=train, name="training", daemon=True)
    trainer.start()
    try:
        assert writer.wait_uploaded(STORE_TIMEOUT), "the run's first segment never reached the store"
        store.stop()
        assert writer.events.wait_for_outage(STORE_TIMEOUT), "the writer did not notice the store was gone"
        assert spilled_segments(run.run_dir)  # it keeps what the store did not take on this host's disk
        store.restart()
        # Every segment held meanwhile is in the store again (the line saying so is in the run's log by then).
        assert writer.events.wait_uploaded(STORE_TIMEOUT), "the held segments did not go up after the restart"
    finally:
        stop_training.set()
        trainer.join(STORE_TIMEOUT)
    started = time.monotonic()
    run.finish()
    assert time.monotonic() - started < STORE_TIMEOUT

    # Training was never held: no record() took anywhere near one flush, through the outage and the return.
    assert max(record_seconds) < MAX_RECORD_SECONDS, f"the slowest record() took {max(record_seconds):.3f} s"
    # The run is whole in the store, every event once, and its log says why it paused.
    after = RunStore(url)
    assert steps_of(after, run.run_id) == list(range(len(record_seconds)))
    data = after.load(run.run_id)
    assert data.info.status == "done" and not data.problems
    assert sum(isinstance(event, RunFinished) for _, event in data.events) == 1
    log = log_of(after, run.run_id)
    assert any(re.match(r"store unreachable since \d\d:\d\d:\d\d, \d+ events pending \(kept in ", text) for text in log)
    assert any(re.match(r"the store answered again after \d+ s; the \d+ events held meanwhile", text) for text in log)
    # The user heard both on stderr, and nothing is left on this host.
    err = capsys.readouterr().err
    assert f"tpudash: {run.location}: store unreachable since " in err
    assert f"tpudash: {run.location}: the store answered again after " in err
    assert not run.run_dir.exists()


# -- Faults: a writer killed -9 ------------------------------------------------------------------------


def test_a_writer_killed_mid_run_leaves_a_readable_run_that_turns_stale(gcs_store, tmp_path, monkeypatch, capsys):
    url = gcs_store.url("runs")
    monkeypatch.setenv("TPUDASH_RUNS_DIR", url)
    writer = start_child([sys.executable, "-m", "tests.writer_process", "killed"], tmp_path / "writer.err")
    try:
        started = line_from(writer)
        assert started.startswith("started "), (tmp_path / "writer.err").read_text()
        run_id = started.split()[1]
        for value in (0.9, 0.5, 0.3):
            writer.stdin.write(f"metric {value}\n")
            writer.stdin.flush()
            assert line_from(writer).startswith("metric ")
        runs = RunStore(url)
        wait_until(lambda: steps_so_far(runs, run_id) == [0, 1, 2], "the writer's three points in the store")
        writer.send_signal(signal.SIGKILL)
        assert writer.wait(CHILD_TIMEOUT) == -signal.SIGKILL
    finally:
        end_child(writer)

    # Just killed: its last heartbeat is fresh, so the run still reads as running.
    info = RunStore(url).info(run_id)
    assert (info.status, info.live) == ("running", True)

    # A reader whose clock is past the heartbeat's limit (STALE_AFTER_INTERVALS heartbeats): rather than wait
    # 15 s for real, every liveness judgement below is made with `now` in the future; the killed writer's own
    # heartbeat, as it left it in the store, is what is judged.
    later = time.time() + liveness.STALE_AFTER_INTERVALS * liveness.HEARTBEAT_INTERVAL_SECONDS + 1
    monkeypatch.setattr(liveness, "store_writers_alive", functools.partial(liveness.store_writers_alive, now=later))
    runs = RunStore(url)
    data = runs.load(run_id)
    assert (data.info.status, data.info.live) == ("stale", False)
    assert [event.value for _, event in data.events if isinstance(event, Metric)] == [0.9, 0.5, 0.3]
    assert cli.main(["runs", "--json", "--runs-dir", url]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert (listed["run_id"], listed["status"], listed["live"]) == (run_id, "stale", False)


# -- Faults: two writers on one run ---------------------------------------------------------------------


def test_two_writers_on_one_run_never_overwrite_each_others_segments(s3_store, tmp_path):
    url = s3_store.url("runs")
    run_id = new_run_id("two-writers")
    count = 40
    writers = [
        start_child(
            [sys.executable, "-m", "tests.functional.bucket_writer", url, run_id, metric, str(count)],
            tmp_path / f"{metric}.err",
        )
        for metric in ("loss_a", "loss_b")
    ]
    try:
        for writer, metric in zip(writers, ("loss_a", "loss_b"), strict=True):
            out, _ = writer.communicate(timeout=CHILD_TIMEOUT)
            assert (writer.returncode, out.strip()) == (0, f"wrote {count}"), (tmp_path / f"{metric}.err").read_text()
    finally:
        for writer in writers:
            end_child(writer)

    runs = RunStore(url)
    # Every event of both is in the store, once.
    assert steps_of(runs, run_id, "loss_a") == list(range(count))
    assert steps_of(runs, run_id, "loss_b") == list(range(count))
    # Each wrote its own numbered segments, the same numbers side by side, none missing.
    numbers: dict[str, list[int]] = {}
    for name in runs.files(run_id).list("events"):
        writer_id, seq = segment_order(name)
        numbers.setdefault(writer_id, []).append(seq)
    assert len(numbers) == 2
    for seqs in numbers.values():
        assert sorted(seqs) == list(range(1, len(seqs) + 1)) and len(seqs) > 1


# -- Faults: the finish while the store is away ----------------------------------------------------------


def test_a_finish_with_the_store_away_returns_in_time_keeps_the_run_and_tpudash_copy_completes_it(gcs_store, capsys):
    url = gcs_store.url("runs")
    run_id = new_run_id("kept")
    recorder = RunStore(url).create(run_id, "kept", {}, {})
    assert isinstance(recorder, StoreRecorder)
    recorder.finish_wait = FINISH_WAIT_SECONDS
    recorder.record(RunStarted(run_id, "kept", {}, {}, time.time()))
    for step in range(50):
        recorder.record(Metric("loss", 1.0 / (step + 1), step))
    assert recorder.wait_uploaded(STORE_TIMEOUT), "the run's record and first segment never reached the store"

    gcs_store.stop()
    for step in range(50, 100):
        recorder.record(Metric("loss", 1.0 / (step + 1), step))
    started = time.monotonic()
    recorder.record(RunFinished("done", {"steps": 100}))
    took = time.monotonic() - started

    assert took < FINISH_WAIT_SECONDS + 1.0, f"the finish took {took:.1f} s"
    kept = recorder.kept_locally
    assert kept is not None and kept.is_dir()
    [line] = [line for line in capsys.readouterr().err.splitlines() if "could not be uploaded" in line]
    assert line.startswith(f"tpudash: run {run_id}: ") and f"kept in {kept} " in line
    command = re.search(r"`(tpudash copy [^`]+)`", line)
    assert command is not None, line

    gcs_store.restart()
    assert RunStore(url).info(run_id).status != "done"  # only the kept record says how the run ended
    argv = shlex.split(command[1])
    assert argv[:3] == ["tpudash", "copy", str(kept)]
    assert cli.main(argv[1:]) == 0
    assert capsys.readouterr().out.startswith(f"copied {run_id} to {url}/{run_id}")

    after = RunStore(url)
    data = after.load(run_id)
    assert (data.info.status, data.info.summary) == ("done", {"steps": 100})
    assert steps_of(after, run_id) == list(range(100))
    assert sum(isinstance(event, RunFinished) for _, event in data.events) == 1
