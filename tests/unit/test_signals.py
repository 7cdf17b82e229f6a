"""Signals to ``tpudash run``: SIGTERM and SIGINT cancel cleanly, twice stops at once, SIGKILL loses nothing written.

Each test starts the real console script with ``--json`` and reads its
standard output line by line: the signal is sent once the job has reported
its first step (or, for the double Ctrl-C, once a job that ignores cancel has
said it is inside its work, where it stays until the test releases it after
the process has gone), so nothing depends on timing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.unit.test_cli import USER_UNSET
from tpudash.runs.store import RunStore

TPUDASH_SCRIPT = Path(sys.executable).with_name("tpudash")
EXIT_CANCELLED = 130
WAIT_SECONDS = 120
# Generous for a loaded machine (the process has TensorFlow to tear down),
# yet far from "waits for the job", which here is forever.
STOP_AT_ONCE_SECONDS = 30
# Far more steps than a test waits for: only a signal ends this run.
ENDLESS_DESCENT = ["run", "gradient-descent", "--set", "steps=100000", "--json"]


class HeadlessRun:
    """``tpudash run … --json`` in a child process, read one event at a time."""

    def __init__(
        self,
        argv: list[str],
        runs_dir: Path,
        command: list[str] | None = None,
        env: dict | None = None,
        pass_fds: tuple[int, ...] = (),
    ):
        environment = {key: value for key, value in os.environ.items() if key not in USER_UNSET}
        environment["TPUDASH_RUNS_DIR"] = str(runs_dir)
        environment.update(env or {})
        self.process = subprocess.Popen(
            [*(command or [str(TPUDASH_SCRIPT)]), *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=environment,
            pass_fds=pass_fds,
        )
        self.events: list[dict] = []

    def read_until(self, wanted) -> dict:
        """Events up to and including the first for which ``wanted(event)`` is true."""
        for line in self.process.stdout:
            event = json.loads(line)
            self.events.append(event)
            if wanted(event):
                return event
        raise AssertionError(f"the run ended without the event; stderr:\n{self.process.stderr.read()}")

    def read_stderr_until(self, text: str) -> None:
        for line in self.process.stderr:
            if text in line:
                return
        raise AssertionError(f"standard error never said {text!r}")

    def finish(self, timeout: float = WAIT_SECONDS) -> tuple[int, str]:
        """Read the rest; the exit code and standard error."""
        out, err = self.process.communicate(timeout=timeout)
        self.events.extend(json.loads(line) for line in out.splitlines())
        return self.process.returncode, err

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


@pytest.fixture
def headless(isolated_runs_dir):
    started: list[HeadlessRun] = []

    def start(argv: list[str], **options) -> HeadlessRun:
        run = HeadlessRun(argv, isolated_runs_dir, **options)
        started.append(run)
        return run

    yield start
    for run in started:
        run.kill()


def is_first_step(event: dict) -> bool:
    return event["type"] == "progress" and event["done"] >= 1


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_cancels_the_run_records_it_and_exits_130(signal_number, headless, isolated_runs_dir):
    run = headless(ENDLESS_DESCENT)
    run.read_until(is_first_step)
    run.process.send_signal(signal_number)
    code, err = run.finish()

    assert code == EXIT_CANCELLED
    assert f"cancelling gradient-descent (signal {signal.Signals(signal_number).name}); again to stop at once" in err
    assert "Traceback" not in err
    assert run.events[-1]["type"] == "run_finished" and run.events[-1]["status"] == "cancelled"
    steps = [event["done"] for event in run.events if event["type"] == "progress"]
    assert 1 <= steps[-1] < 100000

    [info] = RunStore(isolated_runs_dir).list_runs()
    assert info.status == "cancelled"
    assert json.loads((Path(info.path) / "run.json").read_text())["status"] == "cancelled"
    data = RunStore(isolated_runs_dir).load(info.run_id)
    assert data.problems == []
    # The record holds every event the user saw, up to and including the finish.
    assert [event.type for _, event in data.events] == [event["type"] for event in run.events]
    assert (
        data.info.final_metrics["loss"]
        == [event for event in run.events if event["type"] == "metric" and event["name"] == "loss"][-1]["value"]
    )


# The console script (what pip writes into bin/tpudash), with one more job:
# it says it is inside its work, then ignores cancel, as one long native call
# does (a big matmul), until the test writes to or closes its pipe.
CONSOLE_SCRIPT_WITH_A_BLOCKED_JOB = textwrap.dedent(
    """
    import os
    import sys

    from jobs import registry
    from jobs.base import JobSpec
    from tpudash.cli.main import main

    def wait_for_release(ctx, params):
        ctx.log("inside the job; it ignores cancel until released")
        os.read(int(os.environ["TPUDASH_TEST_RELEASE_FD"]), 1)
        ctx.log("released")
        return {}

    registry()["test-blocked"] = JobSpec("test-blocked", "Test blocked", "waits for the test (tests only)", (),
                                         wait_for_release)
    sys.argv[0] = "tpudash"
    sys.exit(main())
    """
)


def test_a_second_sigint_stops_at_once_and_the_run_reads_as_interrupted(headless, isolated_runs_dir):
    release_read, release_write = os.pipe()
    try:
        run = headless(
            ["run", "test-blocked", "--json"],
            command=[sys.executable, "-c", CONSOLE_SCRIPT_WITH_A_BLOCKED_JOB],
            env={"TPUDASH_TEST_RELEASE_FD": str(release_read)},
            pass_fds=(release_read,),
        )
        os.close(release_read)
        run.read_until(lambda event: event["type"] == "log" and event["text"].startswith("inside the job"))
        run.process.send_signal(signal.SIGINT)
        run.read_stderr_until("cancelling test-blocked (signal SIGINT); again to stop at once")
        run.process.send_signal(signal.SIGINT)
        # The job is still inside its work (nothing has released it): the process must end without it.
        try:
            code, err = run.finish(timeout=STOP_AT_ONCE_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"a second SIGINT did not stop `tpudash run` within {STOP_AT_ONCE_SECONDS} s "
                "while its job was inside its work"
            )
    finally:
        os.close(release_write)

    assert code == EXIT_CANCELLED
    assert "Traceback" not in err
    assert not any(event["type"] == "run_finished" for event in run.events)
    assert not any(event["type"] == "log" and event["text"] == "released" for event in run.events)
    [info] = RunStore(isolated_runs_dir).list_runs()
    assert info.status == "interrupted"
    data = RunStore(isolated_runs_dir).load(info.run_id)
    assert [event.type for _, event in data.events] == [event["type"] for event in run.events]


def test_sigkill_keeps_every_event_the_user_saw_and_the_run_reads_as_interrupted(headless, isolated_runs_dir):
    run = headless(ENDLESS_DESCENT)
    run.read_until(lambda event: event["type"] == "progress" and event["done"] >= 5)
    run.process.send_signal(signal.SIGKILL)
    # What is left in the pipe is not read: the kill may have cut its last line.
    assert run.process.wait(WAIT_SECONDS) == -signal.SIGKILL
    [info] = RunStore(isolated_runs_dir).list_runs()
    assert info.status == "interrupted"
    data = RunStore(isolated_runs_dir).load(info.run_id)
    # Events are written to the record before they are printed, so the record
    # has at least what the user saw; at most one line was cut by the kill.
    seen_steps = [event["done"] for event in run.events if event["type"] == "progress"]
    recorded_steps = [event.done for _, event in data.events if event.type == "progress"]
    assert recorded_steps[: len(seen_steps)] == seen_steps
    assert len(data.problems) <= 1 and all(problem.startswith("events.jsonl line") for problem in data.problems)
    assert info.final_metrics["loss"] > 0
