"""What a reader of the runs directory refuses, and how a run still shows: issue 25's reproductions, one test each.

Each file here is one a writer other than tpudash could leave: well-formed
JSON with the wrong types, numbers out of range in run.json, a FIFO named
run.json, an events.jsonl linked to /dev/zero, a line longer than the cap,
a writer's half-written last line, and a run id that climbs out of the runs
directory.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time

import pytest

from jobs.events import Metric, RunFinished, RunStarted, Table, dumps
from tpudash.format import format_timestamp
from tpudash.runs.follow import RunFollower
from tpudash.runs.layout import new_run_id
from tpudash.runs.store import RunStore
from tpudash.runs.tail import EventTail, LineTail

# Well-formed JSON that is not an event a view can draw: each ended the app before issue 25.
WRONG_TYPES = {
    "t-soon": {"type": "metric", "t": "soon", "name": "loss", "value": 0.4, "step": 2},
    "step-one": {"type": "metric", "t": 3.0, "name": "loss", "value": 0.4, "step": "one"},
    "columns-5": {"type": "table", "t": 3.0, "title": "check", "columns": 5, "rows": []},
}


@pytest.fixture
def store(tmp_path):
    return RunStore(tmp_path / "runs")


def make_run(store: RunStore, extra_lines: list[str] = (), finish: bool = True, **meta) -> str:
    """A finished run with two loss points, ``extra_lines`` appended to events.jsonl and ``meta`` into run.json."""
    run_id = new_run_id("train")
    recorder = store.create(run_id, "train", {"epochs": 1}, {"kind": "CPU"})
    recorder.record(RunStarted(run_id, "train", {"epochs": 1}, {"kind": "CPU"}, 1.0), timestamp=1.0)
    recorder.record(Metric("loss", 0.5, 0), timestamp=2.0)
    recorder.record(Metric("loss", 0.25, 1), timestamp=4.0)
    if finish:
        recorder.record(RunFinished("done", {}), timestamp=5.0)
    recorder.close()
    events = store.root / run_id / "events.jsonl"
    lines = events.read_text().splitlines(keepends=True)
    events.write_text("".join(lines[:2] + [line + "\n" for line in extra_lines] + lines[2:]))
    if meta:
        path = store.root / run_id / "run.json"
        record = json.loads(path.read_text())
        record.update(meta)
        path.write_text(json.dumps(record))
    return run_id


@pytest.mark.parametrize("bad", WRONG_TYPES.values(), ids=WRONG_TYPES.keys())
def test_an_event_of_the_wrong_types_is_skipped_counted_and_the_rest_of_the_run_shows(store, bad):
    run_id = make_run(store, [json.dumps(bad)])
    data = store.load(run_id)
    assert [event.value for _, event in data.metrics()] == [0.5, 0.25]
    assert data.problems == [data.problems[0]] and data.problems[0].startswith(
        f"1 event could not be read: events.jsonl line 3: {bad['type']} event: "
    )
    follower = RunFollower(store, run_id)
    follower.poll()  # the dashboard's reader: the event never reaches the model
    assert follower.ended and follower.model.status == "done"
    assert follower.model.tracks[("loss", "train", "step")].last == 0.25
    assert follower.model.tables == {}


def test_the_refusal_names_the_event_the_field_and_what_is_allowed(store):
    run_id = make_run(store, [json.dumps(bad) for bad in WRONG_TYPES.values()])
    tail = EventTail(store.root / run_id / "events.jsonl")
    assert len(tail.read_new(final=True)) == 4  # started, two losses, finished
    assert tail.problem_count == 3
    assert tail.problems == [
        "events.jsonl line 3: metric event: t must be a unix time (1970 to 9999), not 'soon'",
        "events.jsonl line 4: metric event: step must be a whole number from 0 to 2**53, not 'one'",
        "events.jsonl line 5: table event: columns must be a list of at most 100000 values, 32 levels deep, not 5",
    ]
    assert tail.report() == [f"3 events could not be read: {tail.problems[0]}"]


@pytest.mark.parametrize("started", [1e300, math.inf, -1.0, True, "yesterday"])
def test_a_started_out_of_range_is_refused_and_shows_as_unknown(store, started):
    run_id = make_run(store, started=started)
    [info] = store.list_runs()
    assert info.run_id == run_id and info.started is None and info.duration is None
    assert any(problem.startswith("run.json: started must be a unix time") for problem in info.problems)
    assert info.status == "done" and info.final_metrics == {"loss": 0.25}
    assert format_timestamp(started) == "?"


@pytest.mark.parametrize("pid", [2**70, -1, 0, True, "1"])
def test_a_pid_out_of_range_never_counts_as_live_and_the_scan_survives(store, pid):
    good = make_run(store)
    bad = make_run(store, finish=False, pid=pid, host=socket.gethostname(), status="running")
    runs = {info.run_id: info for info in store.list_runs()}
    assert set(runs) == {good, bad}
    assert runs[bad].pid is None and not runs[bad].live and runs[bad].status == "interrupted"
    assert any("pid must be a process id from 1 to 4194304" in problem for problem in runs[bad].problems)


def test_a_fifo_named_run_json_is_refused_and_the_scan_returns(store):
    run_id = make_run(store)
    fifo = store.root / run_id / "run.json"
    fifo.unlink()
    os.mkfifo(fifo)
    listed: list = []
    scan = threading.Thread(target=lambda: listed.extend(store.list_runs()), daemon=True)
    scan.start()
    try:
        scan.join(timeout=10)
        assert not scan.is_alive(), "the runs scan blocked on the FIFO"
    finally:
        if scan.is_alive():  # unblock the old reader, so the thread ends with the test
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    [info] = listed
    assert info.problems[0] == "run.json: not a regular file (a FIFO)"
    assert info.job == "train" and info.status == "done"  # from its events instead


def test_an_events_file_linked_to_dev_zero_is_refused_not_read(store):
    run_id = make_run(store)
    events = store.root / run_id / "events.jsonl"
    events.unlink()
    events.symlink_to("/dev/zero")
    data = store.load(run_id)
    assert data.events == [] and "events.jsonl: a symbolic link, not followed" in data.problems
    follower = RunFollower(store, run_id)
    assert follower.poll() == []


def test_a_run_json_over_the_cap_is_refused_by_name(store):
    run_id = make_run(store)
    (store.root / run_id / "run.json").write_text(json.dumps({"job": "train", "padding": "x" * (1 << 20)}))
    [info] = store.list_runs()
    assert info.problems[0] == "run.json: larger than 1 MiB" and info.job == "train"


@pytest.mark.parametrize("run_id", ["..", ".", "", ".hidden", "a/b", "../runs"])
def test_a_run_id_that_is_not_a_directory_name_is_refused(store, run_id):
    make_run(store)
    with pytest.raises(KeyError, match="is not a run id: a run id is the name of a directory in the runs directory"):
        store.find(run_id)


def test_a_symlinked_run_directory_is_listed_with_its_problem_and_never_read_through(store, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    real = make_run(store)
    os.rename(store.root / real, elsewhere)
    (store.root / real).symlink_to(elsewhere, target_is_directory=True)
    [info] = store.list_runs()
    assert info.run_id == real and info.problems == [f"{real}: a symbolic link, not followed"]
    with pytest.raises(KeyError, match="a symbolic link to a directory, not followed"):
        store.load(real)


def test_a_line_over_the_cap_is_skipped_by_number_and_the_next_still_reads(store):
    run_id = make_run(store, [json.dumps({"type": "log", "level": "info", "text": "x" * (1 << 20)})])
    data = store.load(run_id)
    assert [event.value for _, event in data.metrics()] == [0.5, 0.25]
    assert data.problems == ["1 event could not be read: events.jsonl line 3: longer than 1 MiB"]


def test_a_partial_last_line_waits_for_its_newline(tmp_path):
    """A writer mid-line: its half event is neither returned nor a problem until the rest arrives."""
    path = tmp_path / "events.jsonl"
    whole, second = dumps(Metric("loss", 0.5, 0), 1.0), dumps(Table("check", ["device"], [["cpu:0"]]), 2.0)
    path.write_text(whole + "\n" + second[:20])
    tail = EventTail(path)
    assert [type(event).__name__ for _, event in tail.read_new()] == ["Metric"]
    assert tail.read_new() == [] and tail.problems == []
    with open(path, "a") as handle:
        handle.write(second[20:] + "\n")
    assert [type(event).__name__ for _, event in tail.read_new()] == ["Table"]
    assert tail.problem_count == 0
    tail.close()
    lines = LineTail(path, chunk_bytes=7)  # many reads per call: lines still come whole
    assert lines.read_lines() == [whole.encode(), second.encode()]
    lines.close()


def test_formatting_a_time_never_raises():
    assert format_timestamp(1e300) == format_timestamp(math.inf) == format_timestamp(math.nan) == "?"
    assert format_timestamp(0.0) == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(0.0))
