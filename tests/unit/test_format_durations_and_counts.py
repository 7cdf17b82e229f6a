"""Numbers as a user reads them: one run has one duration everywhere, and a count agrees with its noun."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from jobs.events import RunFinished, RunStarted
from screens.history import run_duration_text
from tpudash.accel.description import LogicalDeviceInfo, RuntimeDescription
from tpudash.cli.render import render_devices, render_runs
from tpudash.cli.sinks import ConsoleSink
from tpudash.format import counted, format_seconds
from tpudash.runs.follow import RunFollower
from tpudash.runs.layout import new_run_id
from tpudash.runs.store import RunInfo


def plain_console(width: int = 200) -> Console:
    return Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(19.998, "00:20"), (20.003, "00:20"), (19.4, "00:19"), (59.5, "01:00"), (9.96, "00:10"), (9.94, "9.9s")],
)
def test_a_duration_is_rounded_to_the_unit_it_is_shown_in(seconds, shown):
    assert format_seconds(seconds) == shown


def test_one_run_shows_one_duration_in_the_run_view_history_and_tpudash_runs(store):
    run_id = new_run_id("train")
    recorder = store.create(run_id, "train", {}, {})
    # The runner sends RunStarted a few milliseconds after it created the run directory.
    began = recorder.meta["started"] + 0.005
    recorder.record(RunStarted(run_id, "train", {}, {}, began), began)
    recorder.record(RunFinished(status="done"), began + 19.998)

    follower = RunFollower(store, run_id)
    follower.poll()
    model = follower.model
    run_view = format_seconds(model.elapsed(), precise=model.finished_state)  # the run view's header
    info = store.info(store.find(run_id))
    console = plain_console()
    render_runs([info], store.root, console)

    assert run_view == run_duration_text(info) == "00:20"
    assert "  00:20  " in console.file.getvalue()
    assert info.duration == pytest.approx(model.elapsed(), abs=1e-3)  # events.jsonl keeps times to the millisecond


def test_counted_agrees_with_its_noun():
    assert counted(1, "replica") == "1 replica"
    assert counted(8, "replica") == "8 replicas"
    assert counted(0, "problem") == "0 problems"
    assert counted(2, "process", "processes") == "2 processes"


def test_one_replica_and_one_problem_read_in_the_singular_headless(tmp_path):
    device = LogicalDeviceInfo(name="/job:localhost/replica:0/task:0/device:GPU:0", device_type="GPU", index=0)
    console = plain_console()
    render_devices(RuntimeDescription("GPU", "DefaultDistributionStrategy", 1, [device], host="box"), console)
    sink = ConsoleSink(console)
    runtime = {"kind": "GPU", "strategy": "DefaultDistributionStrategy", "num_replicas": 1}
    sink(None, RunStarted("r", "matmul", {}, runtime, time.time()))
    sink.close()
    problem_run = RunInfo(run_id=new_run_id("matmul"), path=tmp_path, status="done", problems=["events.jsonl: cut"])
    render_runs([problem_run], tmp_path, console)
    out = console.file.getvalue()

    assert "DefaultDistributionStrategy · 1 replica in sync" in out
    assert "on GPU · DefaultDistributionStrategy, 1 replica\n" in out  # tpudash run's first line
    assert "(! 1 problem)" in out
    assert "1 replicas" not in out and "1 problems" not in out
