"""Run records on disk: kept through crashes, readable when damaged, exportable."""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from jobs.events import Metric, Progress, RunFinished, RunStarted
from tpudash.runs import layout as records
from tpudash.runs import liveness
from tpudash.runs.layout import new_run_id
from tpudash.runs.store import RunStore


def make_run(store: RunStore, job: str = "train", finish: str | None = "done") -> str:
    run_id = new_run_id(job)
    recorder = store.create(run_id, job, {"epochs": 2}, {"kind": "CPU"})
    recorder.record(RunStarted(run_id, job, {"epochs": 2}, {"kind": "CPU"}, 0.0))
    for step in range(4):
        recorder.record(Metric("loss", 1.0 - step * 0.2, step, epoch=step // 2))
    recorder.record(Metric("accuracy", 0.75, 3, epoch=1, split="val"))
    recorder.record(Progress(2, 2, "epoch"))
    if finish:
        recorder.record(RunFinished(finish, {"val_accuracy": 0.75}))
    else:
        recorder.close()
    return run_id


def test_run_ids_sort_by_start_time_and_name_the_job():
    early, late = new_run_id("matmul", now=0), new_run_id("matmul", now=3600)
    assert early.startswith("19700101-000000-matmul-") and len(early.rsplit("-", 1)[1]) == 6
    assert early < late


def test_finished_runs_list_with_status_duration_and_final_metrics(store):
    run_id = make_run(store)
    [info] = store.list_runs()
    assert info.run_id == run_id and info.job == "train" and info.status == "done"
    assert info.final_metrics == {"loss": pytest.approx(0.4), "val_accuracy": 0.75}
    assert info.duration is not None and info.duration >= 0
    assert info.problems == []


# Enough metrics that run.json spans several write() calls (tens of kB):
# a file written in place would be seen half-written.
MANY_METRICS = 1500


def test_run_json_is_replaced_atomically_while_a_reader_reads_it(store):
    """The History screen reads run.json while the run rewrites it: it never sees a partial file."""
    run_id = new_run_id("train")
    recorder = store.create(run_id, "train", {"epochs": 2}, {"kind": "CPU"})
    run_dir = store.find(run_id)
    for index in range(MANY_METRICS):
        recorder.record(Metric(f"metric_{index}", 0.5, 0))
    recorder.record(Progress(0, None, "epoch"))  # run.json now names every metric
    reads, torn = [], []
    writing_done = threading.Event()

    def read_until_the_writer_stops():
        while not writing_done.is_set():
            info = store.info(run_dir)
            reads.append(info.final_metrics.get("epoch_marker"))
            if info.problems or info.job != "train" or len(info.final_metrics) not in (MANY_METRICS, MANY_METRICS + 1):
                torn.append((info.problems, info.job, len(info.final_metrics)))

    reader = threading.Thread(target=read_until_the_writer_stops)
    reader.start()
    writes = 0
    try:
        # Each epoch rewrites run.json; keep rewriting until the reader has
        # read it many times, so the reads overlap the replacements.
        while (len(reads) < 300 or writes < 50) and writes < 20000:
            recorder.record(Metric("epoch_marker", float(writes), writes))
            recorder.record(Progress(writes, None, "epoch"))
            writes += 1
    finally:
        writing_done.set()
        reader.join(timeout=60)
    assert torn == []
    assert len(set(reads)) > 10  # the reader saw many successive versions, not one
    recorder.record(RunFinished("done", {}))
    assert sorted(path.name for path in run_dir.iterdir()) == ["events.jsonl", "run.json", "writer.lock"]


@pytest.mark.parametrize("failing_step", ["write", "replace"])
def test_a_run_json_write_that_fails_midway_keeps_the_old_file_and_leaves_no_temp_file(
    store, monkeypatch, failing_step
):
    """A full disk while run.json is rewritten: the last complete run.json stays, and no stray temp file."""
    run_id = new_run_id("train")
    recorder = store.create(run_id, "train", {"epochs": 2}, {"kind": "CPU"})
    run_dir = store.find(run_id)
    recorder.record(Metric("loss", 0.5, 0, epoch=0))
    recorder.record(Progress(1, 2, "epoch"))
    before = (run_dir / "run.json").read_text()
    assert json.loads(before)["final_metrics"] == {"loss": 0.5}

    real_open = open

    def open_then_fail_midway(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        if str(path).endswith(".tmp"):
            real_write = handle.write

            def write_half_then_fail(data):
                real_write(data[: len(data) // 2])
                handle.flush()
                raise OSError(errno.ENOSPC, "No space left on device")

            handle.write = write_half_then_fail
        return handle

    def fail_to_replace(source, destination):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        if failing_step == "write":
            patch.setattr(records, "open", open_then_fail_midway, raising=False)
        else:
            patch.setattr(records.os, "replace", fail_to_replace)
        recorder.record(Metric("loss", 0.25, 1, epoch=1))
        recorder.record(Progress(2, 2, "epoch"))  # kept, not raised: the writer decides what to do
        assert "No space left" in str(recorder.write_error)
    assert (run_dir / "run.json").read_text() == before
    assert sorted(path.name for path in run_dir.iterdir()) == ["events.jsonl", "run.json", "writer.lock"]
    info = store.info(run_dir)
    assert info.problems == [] and info.status == "running" and info.final_metrics == {"loss": 0.5}
    # Once the disk has room again the run ends with everything it emitted.
    recorder.record(RunFinished("done", {}))
    data = store.load(run_id)
    assert data.info.status == "done" and data.info.final_metrics == {"loss": 0.25}
    assert [event.value for _, event in data.metrics()] == [0.5, 0.25]


def test_export_csv_has_one_row_per_metric_point(store):
    run_id = make_run(store)
    rows = list(csv.DictReader(io.StringIO(store.export(run_id, "csv"))))
    assert [row["name"] for row in rows] == ["loss"] * 4 + ["accuracy"]
    assert rows[-1]["split"] == "val" and float(rows[-1]["value"]) == 0.75
    exported = json.loads(store.export(run_id[:-2], "json"))
    assert exported["run"]["status"] == "done" and len(exported["metrics"]) == 5
    with pytest.raises(ValueError, match="format: 'xml' is not allowed; allowed: csv, json"):
        store.export(run_id, "xml")


def test_an_unknown_run_id_is_a_clear_error(store):
    make_run(store)
    with pytest.raises(KeyError, match="no run 'nope'"):
        store.find("nope")


def test_a_run_left_running_by_a_dead_process_reads_as_interrupted(store):
    run_id = make_run(store, finish=None)
    run_json = store.find(run_id) / "run.json"
    meta = json.loads(run_json.read_text())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    meta["pid"] = int(dead.stdout)
    run_json.write_text(json.dumps(meta))
    info = store.info(store.find(run_id))
    assert info.status == "interrupted"
    assert info.final_metrics["loss"] == pytest.approx(0.4)


def test_a_run_of_this_live_process_stays_running(store):
    run_id = new_run_id("train")
    recorder = store.create(run_id, "train", {}, {"kind": "CPU"})
    assert store.info(store.find(run_id)).status == "running"
    recorder.close()  # its writer lock goes: the run's writer is gone
    assert store.info(store.find(run_id)).status == "interrupted"


def own_start_ticks() -> str:
    """This process's start time as runs written before psutil stored it: field 22 of /proc/self/stat."""
    return Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="older runs stored /proc start ticks")
@pytest.mark.parametrize(
    "stored, status",
    [
        ({"pid_start": "own ticks"}, "running"),
        ({"pid_start": "1"}, "interrupted"),  # the pid now belongs to a process started long after that writer
        ({"pid_start_time": "own start"}, "running"),
        ({"pid_start_time": 1.0}, "interrupted"),
        ({}, "running"),  # no start time at all: the pid alone decides
    ],
)
def test_the_writers_start_time_tells_it_from_a_later_process_with_its_pid_in_old_and_new_runs(store, stored, status):
    run_id = make_run(store, finish=None)
    (store.find(run_id) / liveness.WRITER_FILE).unlink()  # written before the writer lock: the pid decides
    run_json = store.find(run_id) / "run.json"
    meta = json.loads(run_json.read_text())
    meta.pop("pid_start_time")
    replacements = {"own ticks": own_start_ticks(), "own start": liveness.process_start_time(os.getpid())}
    meta.update({key: replacements.get(value, value) for key, value in stored.items()})
    run_json.write_text(json.dumps(meta))
    info = store.info(store.find(run_id))
    assert (info.status, info.live) == (status, status == "running")


def test_a_process_start_time_is_when_it_started_and_none_once_it_is_gone():
    started = liveness.process_start_time(os.getpid())
    assert started is not None and time.time() - 3600 < started <= time.time()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert liveness.process_start_time(int(dead.stdout)) is None
    assert not liveness.process_alive(int(dead.stdout), started)


def test_damaged_runs_still_list_and_show_what_they_can(store):
    truncated = make_run(store)
    with open(store.find(truncated) / "events.jsonl", "a") as handle:
        handle.write('{"type": "metric", "name": "loss", "val')
    malformed = make_run(store)
    (store.find(malformed) / "run.json").write_text("{not json")
    unknown = make_run(store)
    with open(store.find(unknown) / "events.jsonl", "a") as handle:
        handle.write(json.dumps({"type": "gpu_temperature", "value": 71}) + "\n")
    runs = {info.run_id: info for info in store.list_runs()}
    assert len(runs) == 3
    truncated_data = store.load(truncated)
    assert len(truncated_data.metrics()) == 5
    assert truncated_data.problems == ["1 event could not be read: events.jsonl line 9: truncated or not JSON"]
    malformed_info = runs[malformed]
    assert malformed_info.problems[0].startswith("run.json: unreadable")
    assert malformed_info.job == "train" and malformed_info.status == "done"
    assert malformed_info.final_metrics["val_accuracy"] == 0.75
    assert (
        store.load(unknown)
        .problems[0]
        .startswith("1 event could not be read: events.jsonl line 9: unknown event type 'gpu_temperature'")
    )


def test_an_unreadable_events_file_is_reported_not_raised(store):
    run_id = make_run(store)
    events = store.find(run_id) / "events.jsonl"
    events.unlink()
    events.mkdir()
    data = store.load(run_id)
    assert data.events == []
    assert data.problems == ["events.jsonl: not a regular file (a directory)"]


KILLED_WRITER = textwrap.dedent(
    """
    import sys, threading
    from jobs.base import JobSpec
    from jobs.events import Metric
    from tpudash.runs.store import RunStore
    from tpudash.engine.runner import Runner

    class Runtime:
        def summary(self):
            return {"kind": "CPU"}

    def endless(ctx, params):
        step = 0
        while True:
            ctx.emit(Metric("loss", 1.0 / (step + 1), step))
            step += 1
            if step == 200:
                print("emitted", step, flush=True)
            threading.Event().wait(0.001)

    spec = JobSpec("endless", "Endless", "never stops", (), endless)
    Runner(Runtime, RunStore(sys.argv[1])).run_now(spec, {})
    """
)


def test_sigkill_mid_run_keeps_every_emitted_event_and_reads_as_interrupted(store):
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(store.root)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    try:
        assert child.stdout.readline().strip() == "emitted 200"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    [info] = store.list_runs()
    assert info.status == "interrupted"
    data = store.load(info.run_id)
    steps = [event.step for _, event in data.metrics()]
    assert steps[:200] == list(range(200))
    assert all(problem.startswith("events.jsonl line") for problem in data.problems)
    assert len(data.problems) <= 1  # at most the one line being written when killed
