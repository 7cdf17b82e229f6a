"""A writer killed mid-line: its run still ends readably, and the lane moves on whatever the file holds.

The lane's engine is scripted (as in test_lane.py); the partial line is
what a SIGKILL in the middle of a write leaves.
"""

from __future__ import annotations

import errno
import os
import threading

import pytest

from jobs.events import Metric, RunFinished, RunStarted
from tests.unit.test_lane import STEPS, Recorder, ScriptedEngine, start_run
from tpudash.engine.lane import ENGINE_CRASHED, Lane
from tpudash.engine.protocol import JobFinished, Launch
from tpudash.runs.layout import new_run_id
from tpudash.runs.recorder import RunRecorder
from tpudash.runs.store import RunStore

PARTIAL_LINE = b'{"type": "metric", "name": "loss", "val'


def cut_short(store: RunStore, run_id: str) -> None:
    """What a writer killed in the middle of a write leaves: a last line without its end."""
    with open(store.root / run_id / "events.jsonl", "ab") as events:
        events.write(PARTIAL_LINE)


def test_finish_abandoned_after_a_partial_last_line_ends_the_run_readably_and_counts_that_line_once(store):
    run_id = new_run_id("train")
    recorder = store.create(run_id, "train", {}, {"kind": "CPU"})
    recorder.record(RunStarted(run_id, "train", {}, {"kind": "CPU"}, 1.0))
    recorder.record(Metric("loss", 0.5, 0))
    recorder.close()
    cut_short(store, run_id)

    assert store.finish_abandoned(run_id, "train", {}, "failed", "killed by SIGKILL") is None
    data = store.load(run_id)
    [(_, finished)] = [(stamp, event) for stamp, event in data.events if isinstance(event, RunFinished)]
    assert (finished.status, finished.error) == ("failed", "killed by SIGKILL")
    assert data.info.status == "failed" and data.info.final_metrics == {"loss": 0.5}
    assert [event.type for _, event in data.events] == ["run_started", "metric", "run_finished"]
    assert len(data.problems) == 1 and "events.jsonl line 3" in data.problems[0]


def test_finish_abandoned_never_waits_on_a_fifo_in_place_of_run_json(store):
    """The lane settles a crashed engine's run on its own thread: a FIFO named run.json must not hang it."""
    run_id = new_run_id("train")
    recorder = store.create(run_id, "train", {}, {})
    recorder.record(Metric("loss", 0.5, 0))
    recorder.close()
    run_json = store.root / run_id / "run.json"
    run_json.unlink()
    os.mkfifo(run_json)
    settling = threading.Thread(
        target=store.finish_abandoned, args=(run_id, "train", {}, "failed", "engine crashed"), daemon=True
    )
    settling.start()
    settling.join(timeout=30)
    assert not settling.is_alive(), "finish_abandoned blocked on the FIFO"
    finished = [event for _, event in store.load(run_id).events if isinstance(event, RunFinished)]
    assert [event.status for event in finished] == ["failed"]


def test_a_recorder_opening_an_events_file_that_ends_mid_line_starts_on_a_fresh_line(store):
    run_dir = store.root / new_run_id("train")
    run_dir.mkdir(parents=True)
    (run_dir / "events.jsonl").write_bytes(PARTIAL_LINE)
    recorder = RunRecorder(run_dir, {"run_id": run_dir.name, "job": "train", "status": "running"})
    recorder.record(Metric("loss", 0.25, 1))
    recorder.record(RunFinished("done", {}))
    data = store.load(run_dir.name)
    assert [event.type for _, event in data.events] == ["metric", "run_finished"]
    assert len(data.problems) == 1 and "events.jsonl line 1" in data.problems[0]


@pytest.fixture
def lane_with_engines(store):
    engines: list[ScriptedEngine] = []

    def start(listener):
        engines.append(ScriptedEngine(listener))
        return engines[-1]

    observer = Recorder()
    return Lane(store, start, observer), engines, observer


def test_an_engine_killed_mid_line_ends_its_run_the_next_launch_gets_a_new_engine_and_quit_ends(
    store, lane_with_engines
):
    lane, engines, observer = lane_with_engines
    first = lane.launch(STEPS, {"steps": 5, "lr": 0.1})
    start_run(lane, engines[0], store, first).close()  # the engine's writer is gone (its lock with it)
    cut_short(store, first.run_id)
    lane.poll()
    second = lane.launch(STEPS, {"steps": 3, "lr": 0.1})
    assert second.stage == "queued"

    engines[0].exit(None, "SIGKILL")
    lane.poll()
    assert observer.settled == [(first.run_id, "failed")] and first.settled.is_set()
    assert "killed by SIGKILL while running steps" in first.model.error
    assert store.info(store.find(first.run_id)).status == "failed"
    # The queue moves on: the next run goes to a new engine.
    assert len(engines) == 2 and engines[1].sent == [Launch(second.run_id, "steps", {"steps": "3", "lr": "0.1"})]
    assert lane.engine_state != ENGINE_CRASHED

    lane.stop()
    engines[1].say(JobFinished(second.run_id, "cancelled", None))
    lane.poll()
    assert lane.stopped and not lane.busy


def test_when_the_end_cannot_be_written_the_lane_still_ends_the_run_and_moves_on(store, lane_with_engines, monkeypatch):
    """A full disk: finish_abandoned writes nothing, and the file never says the run ended."""
    lane, engines, observer = lane_with_engines
    first = lane.launch(STEPS, {"steps": 5, "lr": 0.1})
    start_run(lane, engines[0], store, first).close()
    second = lane.launch(STEPS, {"steps": 3, "lr": 0.1})
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(store, "finish_abandoned", lambda *arguments: full)

    engines[0].exit(None, "SIGKILL")
    lane.poll()
    assert observer.settled == [(first.run_id, "failed")]
    assert first.model.error.endswith("its end could not be recorded: [Errno 28] No space left on device")
    assert len(engines) == 2 and engines[1].sent[-1].run_id == second.run_id
