"""Long runs open in bounded memory: a run's file is read a chunk at a time and folded, never held whole.

Both layouts: the appended events.jsonl, and one large segment
``events/<writer>-00000001.jsonl``, which was read whole (issue 37, item 3).
"""

from __future__ import annotations

import json
import tracemalloc

from jobs.events import Metric, Progress, RunFinished, RunStarted, dumps
from tpudash.cli.main import main as tpudash_main
from tpudash.runs.follow import RunFollower
from tpudash.runs.store import RunStore
from tpudash.runs.tail import EventTail

START = 1_790_000_000.0


def write_long_run(store: RunStore, steps: int, finished: bool = True, segment: bool = False) -> str:
    """A training run as a long fit writes it: per step a loss, an accuracy and the progress."""
    recorder = store.create(f"20261125-000000-train-{steps:06d}", "train", {}, {})
    run_id = recorder.run_dir.name
    recorder.close()
    lines = [dumps(RunStarted(run_id, "train", {}, {}, START), START)]
    for step in range(1, steps + 1):
        stamp = START + step
        lines.append(dumps(Metric("loss", 1.0 / step, step, 0), stamp))
        lines.append(dumps(Metric("accuracy", 1.0 - 1.0 / step, step, 0), stamp))
        lines.append(dumps(Progress(step, steps, "step"), stamp))
    if finished:
        lines.append(dumps(RunFinished("done"), START + steps))
    if segment:  # as a writer to a store leaves it: one segment, no appended file
        (recorder.run_dir / "events.jsonl").unlink()
        (recorder.run_dir / "events").mkdir()
        (recorder.run_dir / SEGMENT).write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        (recorder.run_dir / "events.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return run_id


SEGMENT = "events/host-1-abcdef-00000001.jsonl"


def peak_bytes_opening(store: RunStore, run_id: str) -> tuple[int, RunFollower]:
    tracemalloc.start()
    try:
        follower = RunFollower(store, run_id)
        follower.catch_up()
        return tracemalloc.get_traced_memory()[1], follower
    finally:
        tracemalloc.stop()


def test_opening_a_run_four_times_as_long_takes_no_more_memory(tmp_path):
    store = RunStore(tmp_path / "runs")
    short, long = write_long_run(store, 10_000), write_long_run(store, 40_000)
    short_peak, _ = peak_bytes_opening(store, short)
    long_peak, follower = peak_bytes_opening(store, long)
    file_bytes = (store.root / long / "events.jsonl").stat().st_size
    # Everything was read: the last step, the end, the final loss.
    assert follower.ended and follower.model.status == "done"
    assert follower.model.progress["step"].done == 40_000
    assert follower.model.last_metrics()["loss"] == 1.0 / 40_000
    # The file is over 4 MiB; opening it holds less than half of that, and no more than the short run does.
    assert file_bytes > 4 << 20
    assert long_peak < file_bytes / 2
    assert long_peak < 1.5 * short_peak


def test_a_run_listed_without_its_record_is_folded_from_its_events_in_bounded_memory(tmp_path):
    store = RunStore(tmp_path / "runs")
    run_id = write_long_run(store, 40_000, finished=False)
    (store.root / run_id / "run.json").unlink()  # History rebuilds the run from its events
    tracemalloc.start()
    try:
        info = store.info(store.root / run_id)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.status == "interrupted" and info.job == "train"
    assert info.final_metrics["loss"] == 1.0 / 40_000
    assert peak < (store.root / run_id / "events.jsonl").stat().st_size / 2


def test_reading_in_small_pieces_gives_the_events_one_read_gives(tmp_path):
    path = tmp_path / "events.jsonl"
    lines = [dumps(Metric("loss", 1.0 / step, step), START + step) for step in range(1, 200)]
    # The last line is cut off mid-way (a writer killed while writing it): it is read only as final.
    path.write_text("\n".join(lines) + "\n" + lines[0][:20], encoding="utf-8")
    whole = EventTail(path).read_new(final=True)
    pieces = EventTail(path)
    gathered = []
    while True:
        gathered += pieces.read_new(final=True, max_bytes=97)
        if pieces.at_end:
            break
    assert gathered == whole and len(whole) == 199
    assert pieces.problem_count == 1 and "line 200" in pieces.problems[0]
    assert json.loads(lines[-1])["step"] == whole[-1][1].step


# One large segment (issue 37, item 3): before, a segment was read whole, its events held as one list.
STEPS = 6_000
"""18,001 events in 1.9 MB: held as one list they took nearly what opening the run takes again."""


def peak_bytes_of(work) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_run_in_one_large_segment_opens_in_as_little_memory_as_the_same_run_appended(tmp_path):
    store, appended_store = RunStore(tmp_path / "runs"), RunStore(tmp_path / "appended")
    appended, in_a_segment = write_long_run(appended_store, STEPS), write_long_run(store, STEPS, segment=True)
    appended_peak, _ = peak_bytes_opening(appended_store, appended)
    segment_peak, follower = peak_bytes_opening(store, in_a_segment)
    assert follower.ended and follower.model.status == "done"
    assert follower.model.progress["step"].done == STEPS
    assert follower.model.last_metrics()["loss"] == 1.0 / STEPS
    # The model and a piece of the file (about 6 MB here), as when the same events are appended.
    assert (store.root / in_a_segment / SEGMENT).stat().st_size > 1_800_000
    assert segment_peak < 1.25 * appended_peak


def test_a_crashed_run_in_one_large_segment_lists_in_as_little_memory_as_the_same_run_appended(tmp_path):
    store, appended_store = RunStore(tmp_path / "runs"), RunStore(tmp_path / "appended")
    appended, in_a_segment = (
        write_long_run(appended_store, STEPS, finished=False),
        write_long_run(store, STEPS, finished=False, segment=True),
    )
    (appended_store.root / appended / "run.json").unlink()  # the listing rebuilds the runs from their events
    (store.root / in_a_segment / "run.json").unlink()
    listed = []
    appended_peak = peak_bytes_of(lambda: appended_store.info(appended_store.root / appended))
    segment_peak = peak_bytes_of(lambda: listed.append(store.info(store.root / in_a_segment)))
    assert listed[0].status == "interrupted" and listed[0].job == "train"
    assert listed[0].final_metrics["loss"] == 1.0 / STEPS
    assert segment_peak < 1.25 * appended_peak


def export_csv(store: RunStore, run_id: str, output) -> int:
    return tpudash_main(["export", run_id, "--runs-dir", str(store.root), "-o", str(output)])


def test_tpudash_export_takes_no_more_memory_than_the_listing_folding_the_same_events(tmp_path):
    """The CSV is written as the run is read: before, every event and every row were held first."""
    store, appended_store = RunStore(tmp_path / "runs"), RunStore(tmp_path / "appended")
    run_id = write_long_run(store, STEPS, segment=True)
    appended = write_long_run(appended_store, STEPS, finished=False)
    (appended_store.root / appended / "run.json").unlink()  # the listing folds its events (the tests above)
    listing_peak = peak_bytes_of(lambda: appended_store.info(appended_store.root / appended))
    export_peak = peak_bytes_of(lambda: export_csv(store, run_id, tmp_path / "metrics.csv"))
    with (tmp_path / "metrics.csv").open(encoding="utf-8") as exported:
        header, first = next(exported), next(exported)
        rows = 2 + sum(1 for _ in exported)
    assert header == "time,name,split,step,epoch,value\n"
    assert first.startswith("1790000001.0,loss,train,1,0,1.0")
    assert rows == 1 + 2 * STEPS  # the header, then a loss and an accuracy per step
    assert export_peak < 1.25 * listing_peak


def test_a_run_in_one_large_segment_in_a_store_opens_in_as_little_memory_as_one_appended_on_disk(tmp_path):
    """In a bucket (memory://, the code of gs:// and s3://) a segment is read by ranges, a piece at a time."""
    import uuid

    import fsspec

    local, appended_store = RunStore(tmp_path / "runs"), RunStore(tmp_path / "appended")
    run_id, appended = write_long_run(local, STEPS, segment=True), write_long_run(appended_store, STEPS)
    bucket = f"long-runs-{uuid.uuid4().hex[:8]}"
    memory = fsspec.filesystem("memory")
    stored = f"/{bucket}/runs/{run_id}/{SEGMENT}"
    memory.pipe_file(stored, (local.root / run_id / SEGMENT).read_bytes())
    memory.info(stored)  # memory:// copies an object's bytes at its first look: not the reader's doing
    try:
        store = RunStore(f"memory://{bucket}/runs", spill_root=tmp_path / "unsent")
        appended_peak, _ = peak_bytes_opening(appended_store, appended)
        store_peak, follower = peak_bytes_opening(store, run_id)
    finally:
        memory.rm(f"/{bucket}", recursive=True)
    assert follower.model.progress["step"].done == STEPS
    assert follower.model.last_metrics()["loss"] == 1.0 / STEPS
    assert store_peak < 1.25 * appended_peak
