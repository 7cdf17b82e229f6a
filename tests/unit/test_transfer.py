"""Copying runs between runs directories (``tpudash.runs.transfer``): a disk and a store, either way.

A copied run reads the same as its source, every event once; a copy run
again copies nothing; what a store did not take (a spill directory) merges
into the store's run without duplicating what already went up.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from jobs.events import Log, Metric, RunFinished, RunStarted, dumps
from tpudash.runs.backends import RunFiles
from tpudash.runs.layout import new_run_id
from tpudash.runs.store import RunStore
from tpudash.runs.transfer import copy_run
from tpudash.runs.uploader import StoreRecorder

pytest_plugins = ["tests.object_stores"]  # gcs_store, s3_store: loopback emulators

PROFILE = "tensorboard/plugins/profile/2026_01_01_00_00_00/host.xplane.pb"


def memory_url() -> str:
    """A store of this process's memory no other test shares (fsspec's memory filesystem is process-wide)."""
    return f"memory://transfer-{uuid.uuid4().hex[:8]}/runs"


def record_local_run(runs_dir: Path, *, finish: bool = True) -> str:
    """A run as a job leaves it on disk: events, run.json, the writer's lock, and a profile nested deep."""
    run_id = new_run_id("fit")
    store = RunStore(runs_dir)
    recorder = store.create(run_id, "fit", {"epochs": 3}, {"kind": "CPU"})
    recorder.record(RunStarted(run_id, "fit", {"epochs": 3}, {"kind": "CPU"}, time.time()))
    for step in range(30):
        recorder.record(Metric("loss", 1.0 / (step + 1), step=step))
    recorder.record(Log("info", "half way"))
    profile = store.local_dir(run_id) / PROFILE
    profile.parent.mkdir(parents=True)
    profile.write_bytes(b"\x00xplane" * 100)
    if finish:
        recorder.record(RunFinished(status="done", summary={"steps": 30}))
    else:
        recorder.close()  # no finish: as if its process had been killed
    return run_id


def test_a_run_copied_into_a_store_and_back_reads_the_same_every_event_once(tmp_path):
    source, back = RunStore(tmp_path / "runs"), RunStore(tmp_path / "back")
    bucket = RunStore(memory_url())
    run_id = record_local_run(source.root)  # type: ignore[arg-type]

    up = copy_run(source, run_id, bucket)
    down = copy_run(bucket, run_id, back)

    original = source.load(run_id)
    for copy in (bucket.load(run_id), back.load(run_id)):
        assert copy.info.status == "done"
        assert copy.info.final_metrics == original.info.final_metrics == {"loss": pytest.approx(1 / 30)}
        assert copy.info.summary == {"steps": 30}
        assert [event for _, event in copy.events] == [event for _, event in original.events]
        assert copy.problems == []
    assert up.copied == down.copied == 3  # events.jsonl, run.json and the profile: the lock stays behind
    assert up.copied_bytes == down.copied_bytes
    assert "writer.lock" not in bucket.files(run_id).walk()
    assert (back.local_dir(run_id) / PROFILE).read_bytes() == (source.local_dir(run_id) / PROFILE).read_bytes()
    assert up.destination == f"{bucket.where}/{run_id}"


def test_a_copy_run_again_copies_nothing(tmp_path):
    source, bucket = RunStore(tmp_path / "runs"), RunStore(memory_url())
    run_id = record_local_run(source.root)  # type: ignore[arg-type]
    first = copy_run(source, run_id, bucket)

    again = copy_run(source, run_id, bucket)

    assert first.copied == 3
    assert (again.copied, again.copied_bytes, again.skipped) == (0, 0, 3)


def test_a_run_whose_writer_died_is_copied_as_interrupted_not_as_running_forever(tmp_path):
    source, bucket = RunStore(tmp_path / "runs"), RunStore(memory_url())
    run_id = record_local_run(source.root, finish=False)  # type: ignore[arg-type]
    assert source.info(run_id).status == "interrupted"

    report = copy_run(source, run_id, bucket)

    copied = bucket.info(run_id)
    assert copied.status == "interrupted" and not copied.live and not report.still_running
    assert copied.final_metrics == {"loss": pytest.approx(1 / 30)}
    assert len(bucket.load(run_id).events) == 32  # the start, 30 losses and the log


class FlakyStore:
    """A run's files in a store that can be made unreachable: every write fails while ``down`` is set."""

    def __init__(self, files: RunFiles) -> None:
        self.files = files
        self.where = files.where
        self.down = False

    def __getattr__(self, name: str):
        return getattr(self.files, name)

    def write(self, name: str, data: bytes) -> None:
        if self.down:
            raise ConnectionError(f"{self.where}: connection refused")
        self.files.write(name, data)


def lines_in_segments(files: RunFiles) -> int:
    """How many events a run's segments hold so far."""
    return sum(files.read(f"events/{name}", 1 << 20).count(b"\n") for name in files.list("events"))


def test_what_a_store_did_not_take_merges_into_its_run_each_event_once(tmp_path):
    url, spill_root = memory_url(), tmp_path / "unsent"
    bucket = RunStore(url)
    run_id = new_run_id("fit")
    store_files = FlakyStore(bucket.files(run_id))
    meta = {"run_id": run_id, "job": "fit", "params": {}, "status": "running", "started": time.time()}
    said: list[str] = []
    recorder = StoreRecorder(
        store_files, meta, spill_root=spill_root, seal_seconds=0.05, finish_wait=0.3, notify=said.append
    )
    recorder.record(RunStarted(run_id, "fit", {}, {}, time.time()))
    for step in range(10):
        recorder.record(Metric("loss", float(step), step=step))
    assert recorder.events.wait_uploaded(10)  # the first segments are in the store
    assert lines_in_segments(bucket.files(run_id)) == 11
    store_files.down = True
    for step in range(10, 20):
        recorder.record(Metric("loss", float(step), step=step))
    recorder.record(RunFinished(status="done"))  # waits 0.3 s for the store, then keeps the rest on disk
    assert recorder.kept_locally == spill_root / run_id
    assert any(f"tpudash copy {spill_root / run_id} {url}" in line for line in said)
    in_store_before = set(bucket.files(run_id).walk())

    report = copy_run(RunStore(spill_root), run_id, bucket)

    run = bucket.load(run_id)
    assert run.info.status == "done" and run.problems == []
    losses = [event.value for _, event in run.events if isinstance(event, Metric)]
    assert losses == [float(step) for step in range(20)]  # every one, once, in order
    assert sum(isinstance(event, RunFinished) for _, event in run.events) == 1
    assert report.copied >= 2  # at least the held segment(s) and run.json
    assert not in_store_before & {name for name in RunStore(spill_root).files(run_id).walk() if name != "run.json"}
    assert copy_run(RunStore(spill_root), run_id, bucket).copied == 0


def test_a_segment_both_in_the_spill_and_in_the_store_is_not_uploaded_again(tmp_path):
    """A writer killed between an upload and removing its spilled copy: the copy skips that segment."""
    bucket, spill = RunStore(memory_url()), RunStore(tmp_path / "unsent")
    run_id = new_run_id("fit")
    segment = (dumps(Log("info", "one"), 1767225600.0) + "\n").encode()
    bucket.files(run_id).write("events/host-1-abc-00000001.jsonl", segment)
    spill.files(run_id).write("events/host-1-abc-00000001.jsonl", segment)
    spill.files(run_id).write("events/host-1-abc-00000002.jsonl", segment.replace(b"one", b"two"))
    os.makedirs(spill.local_dir(run_id) / ".partial", exist_ok=True)
    (spill.local_dir(run_id) / ".tmp-segment").write_bytes(b"half")

    report = copy_run(spill, run_id, bucket)

    assert (report.copied, report.skipped) == (1, 1)
    assert sorted(bucket.files(run_id).walk()) == [
        "events/host-1-abc-00000001.jsonl",
        "events/host-1-abc-00000002.jsonl",
    ]


@pytest.mark.parametrize("store_fixture", ["gcs_store", "s3_store"])
def test_a_run_goes_into_a_bucket_and_back_through_each_stores_own_client(store_fixture, request, tmp_path):
    """The same copy through gcsfs and s3fs on their loopback emulators: each file once, and again nothing."""
    handle = request.getfixturevalue(store_fixture)
    source, back = RunStore(tmp_path / "runs"), RunStore(tmp_path / "back")
    bucket = RunStore(handle.url("tpudash/runs"))
    run_id = record_local_run(source.root)  # type: ignore[arg-type]

    up = copy_run(source, run_id, bucket)
    again = copy_run(source, run_id, bucket)
    down = copy_run(bucket, run_id, back)

    assert (up.copied, again.copied, again.skipped, down.copied) == (3, 0, 3, 3)
    assert bucket.info(run_id).status == back.info(run_id).status == "done"
    assert len(back.load(run_id).events) == len(source.load(run_id).events) == 33
    assert (back.local_dir(run_id) / PROFILE).read_bytes() == (source.local_dir(run_id) / PROFILE).read_bytes()
