"""Following runs written by other processes: RunFollower, the runs-directory watch, ``tpudash watch``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tpudash
from tpudash.cli.main import main
from tpudash.runs.follow import RunFollower, RunsDirectoryWatch, newest_live_run
from tpudash.runs.layout import SOURCE_RECORD

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60


class Writer:
    """``tests.writer_process``: a process recording a run one command at a time."""

    def __init__(self, name: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.writer_process", name],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started = self.process.stdout.readline().split()
        assert started[0] == "started", started
        self.run_id = started[1]

    def say(self, command: str) -> str:
        """Send one command; return the answer, given once its effect is on disk."""
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(TIMEOUT)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(TIMEOUT)


@pytest.fixture
def writer():
    writers: list[Writer] = []

    def start(name: str = "custom-loop") -> Writer:
        writers.append(Writer(name))
        return writers[-1]

    yield start
    for item in writers:
        if item.process.poll() is None:
            item.kill()


def test_a_follower_reads_a_live_run_as_it_grows_and_ends_with_it(store):
    run = tpudash.record("growing", params={"lr": 0.1})
    run.metric("loss", 1.0, step=0)
    run.flush()
    follower = RunFollower(store, run.run_id)
    assert [event.type for _, event in follower.poll()] == ["run_started", "metric"]
    assert follower.live and follower.model.status == "running" and follower.info.live
    assert follower.poll() == []
    run.metric("loss", 0.5, step=1)
    run.flush()
    assert [event.value for _, event in follower.poll()] == [0.5]
    run.finish()
    assert [event.type for _, event in follower.poll()] == ["run_finished"]
    assert follower.ended and follower.model.status == "done"
    assert follower.model.tracks[("loss", "train", "step")].count == 2


def test_a_killed_writer_turns_its_run_interrupted_with_every_event_kept(store, writer, capsys):
    process = writer()
    for value in (3.0, 2.0, 1.0):
        assert process.say(f"metric {value}").startswith("metric")
    assert main(["runs", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["status"], listed["live"], listed["pid"]) == ("running", True, process.process.pid)
    watch = RunsDirectoryWatch(store)
    first = watch.scan()
    assert [info.run_id for info in first.appeared_live] == [process.run_id] and first.changed
    assert newest_live_run(store).run_id == process.run_id
    clock = [0.0]
    follower = RunFollower(store, process.run_id, clock=lambda: clock[0])
    follower.poll()
    assert follower.live and follower.info.source == SOURCE_RECORD and follower.info.pid == process.process.pid
    assert watch.scan().changed is False  # nothing happened

    process.kill()
    follower.poll()
    assert follower.live  # the writer is looked at once a second, not at every read
    clock[0] += 1.0
    follower.poll()
    assert follower.ended and follower.model.status == "interrupted"
    assert follower.model.tracks[("loss", "train", "step")].count == 3
    info = store.info(store.find(process.run_id))
    assert info.status == "interrupted" and not info.live and info.final_metrics == {"loss": 1.0}
    assert main(["runs", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["status"], listed["live"]) == ("interrupted", False)
    after = watch.scan()
    assert after.changed and after.live == [] and after.appeared_live == []


def run_watch(*arguments: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tpudash", "watch", *arguments],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, COLUMNS="100", TPUDASH_NATIVE_STDERR="terminal"),
    )


@pytest.mark.parametrize(
    "ending, exit_code, last_words",
    [
        ("finish done", 0, '"type":"run_finished","t":'),
        ("finish cancelled", 130, '"status":"cancelled"'),
        ("kill", 1, "ended without finishing the run: interrupted"),
    ],
)
def test_watch_follows_the_newest_live_run_and_exits_with_its_status(writer, ending, exit_code, last_words):
    process = writer()
    process.say("metric 0.9")
    watch = run_watch("--json")
    lines = [json.loads(watch.stdout.readline()) for _ in range(3)]
    assert [line["type"] for line in lines] == ["run_started", "metric", "progress"]
    assert lines[0]["run_id"] == process.run_id and lines[1]["value"] == 0.9
    process.say("metric 0.4")  # the watcher sees what comes after it started
    assert json.loads(watch.stdout.readline())["value"] == 0.4
    if ending == "kill":
        process.kill()
    else:
        process.say(ending)
    out, err = watch.communicate(timeout=TIMEOUT)
    assert watch.returncode == exit_code, err
    assert last_words in (out + err)


def test_watch_prints_a_run_as_tpudash_run_does_and_refuses_what_it_cannot_follow(store, writer):
    with tpudash.record("finished-loop") as run:
        run.metric("loss", 0.25, step=0)
        run.progress(1, 1, "epoch")
    printed = run_watch(run.run_id[:20])
    out, err = printed.communicate(timeout=TIMEOUT)
    assert printed.returncode == 0, err
    assert f"▶ finished-loop  run {run.run_id}" in out and "✓ done" in out and "epoch 1/1  loss 0.25" in out

    nothing = run_watch()
    _, err = nothing.communicate(timeout=TIMEOUT)
    assert nothing.returncode == 2 and "RUN: no run is live in" in err
    unknown = run_watch("no-such-run")
    _, err = unknown.communicate(timeout=TIMEOUT)
    assert unknown.returncode == 2 and "RUN: no run 'no-such-run'" in err


def test_watch_imports_no_tensorflow():
    code = (
        "import sys; from tpudash.cli.main import main; "
        "code = main(['watch', '--runs-dir', sys.argv[1]]); "
        "assert 'tensorflow' not in sys.modules and 'textual' not in sys.modules; print(code)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(REPO_ROOT / "no-runs-here")],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=TIMEOUT,
    )
    assert result.stdout.strip() == "2", result.stderr


def test_a_run_caught_before_its_run_json_is_looked_at_again(store):
    """A look between the run directory's creation and its run.json must not hide the run for ever."""
    run = tpudash.record("caught-early")
    meta = (run.run_dir / "run.json").read_text()
    (run.run_dir / "run.json").unlink()
    watch = RunsDirectoryWatch(store)
    assert watch.scan().live == []
    (run.run_dir / "run.json").write_text(meta)
    found = watch.scan()
    assert [info.run_id for info in found.appeared_live] == [run.run_id] and found.changed
    run.finish()
