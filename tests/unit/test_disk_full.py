"""A disk that fills up (or a quota, an I/O error, a file size limit) while a run is written.

A job's run ends as failed naming the OS error, and the engine says so; the
headless ``tpudash run`` exits 1 with one line; the user's own training
goes on. The failing write is injected where the recorder appends (no root
needed); the CLI's case is the real thing: ``RLIMIT_FSIZE`` in a child with
SIGXFSZ ignored, so a write past the limit fails with EFBIG.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
import threading

import pytest

import tpudash
from jobs.base import JobSpec, Param
from jobs.events import Metric, RunFinished
from tests.conftest import REPO_ROOT
from tests.unit.test_cli import USER_UNSET
from tpudash.accel.description import RuntimeDescription
from tpudash.engine.inthread import EngineThread
from tpudash.engine.protocol import JobFinished, Launch
from tpudash.engine.runner import Runner
from tpudash.runs.recorder import RunRecorder

WAIT = 30.0
DISK_ERRORS = [errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG]


class FakeRuntime:
    description = RuntimeDescription(kind="CPU", strategy="MirroredStrategy", num_replicas=1, devices=[])

    def summary(self):
        return {"kind": "CPU", "num_replicas": 1}


def counting_job(ctx, params):
    for step in range(params["steps"]):
        ctx.emit(Metric("loss", 1.0 / (step + 1), step))
    return {"steps": params["steps"]}


COUNTS = JobSpec("counts", "Counts", "emits a loss per step", (Param("steps", "int", 5),), run=counting_job)


@pytest.fixture
def disk_fills(monkeypatch):
    """``disk_fills(code, after)``: every append to events.jsonl after the first ``after`` fails with ``code``."""
    real_append = RunRecorder._append

    def fill(code: int, after: int) -> None:
        appended = []

        def append(recorder, data):
            if len(appended) >= after:
                raise OSError(code, os.strerror(code))
            appended.append(data)
            real_append(recorder, data)

        monkeypatch.setattr(RunRecorder, "_append", append)

    return fill


def expected_error(code: int) -> str:
    return f"cannot write the run: [Errno {code}] {os.strerror(code)}"


@pytest.mark.parametrize("code", DISK_ERRORS, ids=errno.errorcode.get)
@pytest.mark.parametrize("after", [0, 3, 6], ids=["at-start", "mid-run", "at-finish"])
def test_a_record_that_cannot_be_written_ends_the_run_failed_naming_the_os_error(store, disk_fills, code, after):
    """after 0: RunStarted fails; 3: a metric; 6: only the RunFinished (the start and 5 metrics went before it)."""
    heard: list = []
    runner = Runner(FakeRuntime, store, sinks=[lambda run, event: heard.append(event)])
    disk_fills(code, after)
    run = runner.run_now(COUNTS, {"steps": 5})  # returns: nothing raised out of the lane, nothing hangs
    assert run.finished_state and (run.state, run.error) == ("failed", expected_error(code))
    assert run.write_error is not None and run.write_error.errno == code
    [finished] = [event for event in heard if isinstance(event, RunFinished)]
    assert (finished.status, finished.error) == ("failed", expected_error(code))
    # run.json (which still fits in this simulation) says so too, and its writer is gone.
    info = store.info(store.find(run.run_id))
    assert (info.status, info.error, info.live) == ("failed", expected_error(code), False)


def test_the_engine_reports_a_run_it_could_not_write_as_failed_with_the_os_error(settings, disk_fills):
    messages: list = []
    finished = threading.Event()

    def listen(message):
        messages.append(message)
        if isinstance(message, JobFinished):
            finished.set()

    engine = EngineThread(listen, settings, {"counts": COUNTS}, FakeRuntime)
    try:
        disk_fills(errno.ENOSPC, 2)
        engine.send(Launch("20261125-000000-counts-abcdef", "counts", {"steps": "5"}))
        assert finished.wait(WAIT)
    finally:
        engine.release()
    [reply] = [message for message in messages if isinstance(message, JobFinished)]
    assert reply == JobFinished(
        "20261125-000000-counts-abcdef", "failed", "cannot write the run: [Errno 28] No space left on device"
    )


def test_the_users_own_training_goes_on_and_finishes_without_raising_on_a_full_disk(disk_fills):
    disk_fills(errno.ENOSPC, 0)
    with tpudash.record("full-disk") as run:
        for step in range(20):
            run.metric("loss", 1.0 / (step + 1), step=step)
        run.flush()  # a flush on a full disk does not raise either
    assert run.status == "done" and run.write_error is not None and run.write_error.errno == errno.ENOSPC


FILE_SIZE_LIMIT = 4096
"""Bytes any file of the child may grow to: run.json (about 1 KiB) fits, the events of a run do not."""


def limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))


def test_tpudash_run_on_a_full_disk_exits_1_with_one_line_naming_the_error_and_the_run(isolated_runs_dir):
    environment = {key: value for key, value in os.environ.items() if key not in USER_UNSET}
    result = subprocess.run(
        [sys.executable, "-m", "tpudash", "run", "gradient-descent", "--tpu", "none"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=environment,
        timeout=120,
        preexec_fn=limit_file_size,
    )
    [run_dir] = [path for path in isolated_runs_dir.iterdir() if path.is_dir() and not path.name.startswith(".")]
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.splitlines() == [
        f"tpudash: cannot write run {run_dir.name} in {isolated_runs_dir}: [Errno 27] File too large"
    ]
    assert "error: cannot write the run: [Errno 27] File too large" in result.stdout
