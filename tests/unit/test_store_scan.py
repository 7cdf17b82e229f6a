"""Listing a bucket of runs whose writers crashed (issue 37, item 2): it costs what changed, not what exists.

Against gcp-storage-emulator on 127.0.0.1 (``tests.object_stores``), with
the HTTP requests gcsfs sends counted. A crashed run is run.json saying
``running`` and no heartbeat; a live one beats in ``writers/``. The bound a
returning writer is seen within is ``judge.SILENT_MAX_SECONDS``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from tpudash.runs.follow import STORE_SCAN_SECONDS, RunsDirectoryWatch
from tpudash.runs.judge import ONE_BY_ONE_RUNS, SILENT_FIRST_SECONDS, SILENT_MAX_SECONDS, WriterJudge
from tpudash.runs.store import RunStore

pytest_plugins = ["tests.object_stores"]  # gcs_store: a loopback GCS emulator


def crashed_id(index: int) -> str:
    return f"20260101-000000-train-{index:06x}"


def live_id(index: int) -> str:
    return f"20260102-000000-train-{index:06x}"


def record(run_id: str) -> bytes:
    meta = {"run_id": run_id, "job": "train", "status": "running", "started": 1.0, "host": "elsewhere", "pid": 1}
    return json.dumps(meta).encode()


def beat() -> bytes:
    return json.dumps({"heartbeat": time.time(), "interval": 5.0}).encode()


def write_runs(gcs_store: Any, prefix: str, crashed: int, live: int) -> str:
    """``crashed`` runs left ``running`` with no heartbeat and ``live`` beating ones, in one upload; their URL."""
    url = gcs_store.url(prefix)
    filesystem, root = gcs_store.filesystem(), f"{gcs_store.bucket}/{prefix}"
    objects = {f"{root}/{crashed_id(index)}/run.json": record(crashed_id(index)) for index in range(crashed)}
    for index in range(live):
        objects[f"{root}/{live_id(index)}/run.json"] = record(live_id(index))
        objects[f"{root}/{live_id(index)}/writers/w{index}.json"] = beat()
    filesystem.pipe(objects)
    return url


class Requests:
    """What one store is asked, counted at its client (fsspec's calls): one per object read, listing or lookup.

    (Counted per call, not per HTTP request: gcsfs's ``info`` races two requests and may send one or both.)
    """

    def __init__(self, store: RunStore) -> None:
        self.client = store.backend.filesystem
        self.count = 0
        store.backend.filesystem = self

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.client, name)
        if name.startswith("_") or name == "invalidate_cache" or not callable(attribute):
            return attribute

        def call(*args, **kwargs):
            paths = args[0] if args else None
            self.count += len(paths) if isinstance(paths, list) else 1  # cat([...]): one object read per path
            return attribute(*args, **kwargs)

        return call


def scan_twice(gcs_store: Any, tmp_path, crashed: int) -> tuple[list, list, int, int]:
    url = write_runs(gcs_store, f"runs-{crashed}", crashed, live=2)
    store = RunStore(url, spill_root=tmp_path / "unsent")
    requests = Requests(store)
    first = store.list_runs()
    first_requests = requests.count
    second = store.list_runs()
    return first, second, first_requests, requests.count - first_requests


def test_a_second_listing_asks_nothing_more_of_a_store_holding_more_crashed_runs(gcs_store, tmp_path):
    few = scan_twice(gcs_store, tmp_path, crashed=ONE_BY_ONE_RUNS + 2)
    many = scan_twice(gcs_store, tmp_path, crashed=4 * (ONE_BY_ONE_RUNS + 2))
    for first, second, _, _ in (few, many):
        for infos in (first, second):
            statuses = Counter((info.status, info.live) for info in infos)
            assert statuses == {("stale", False): len(infos) - 2, ("running", True): 2}
    # The first look reads each run's run.json once, and nothing else per run …
    assert many[2] - few[2] == 3 * (ONE_BY_ONE_RUNS + 2)
    # … and the next asks about the live runs only: the crashed ones cost nothing, however many.
    assert many[3] == few[3]


def test_a_crashed_run_whose_writer_beats_again_is_live_within_the_bound(gcs_store, tmp_path):
    url = write_runs(gcs_store, "runs", crashed=ONE_BY_ONE_RUNS + 4, live=0)
    store = RunStore(url, spill_root=tmp_path / "unsent")
    now = [0.0]
    store.judge = WriterJudge(store.backend, clock=lambda: now[0])
    returning = crashed_id(3)
    scans_at = [0.0]
    while store.judge.silent_for(returning) != SILENT_MAX_SECONDS:  # its silences grow to the longest
        now[0] = scans_at[-1] + (store.judge.silent_for(returning) or 0.0)
        scans_at.append(now[0])
        assert {info.status for info in store.list_runs()} == {"stale"}
    assert len(scans_at) > 3 and SILENT_FIRST_SECONDS < SILENT_MAX_SECONDS
    back_at = now[0]
    asked_for = crashed_id(5)
    for run_id in (returning, asked_for):
        store.files(run_id).write("writers/w.json", beat())  # their writers were cut off, and are back
    assert store.info(asked_for).live  # one run asked for is judged at once, and scans then know it
    now[0] = back_at + 1.0
    listed = {info.run_id: info for info in store.list_runs()}
    assert listed[asked_for].live
    assert listed[returning].status == "stale"  # a scan keeps the verdict of a long silence for a while …
    now[0] = back_at + SILENT_MAX_SECONDS
    listed = {info.run_id: info for info in store.list_runs()}
    assert (listed[returning].status, listed[returning].live) == ("running", True)  # … never longer than the bound
    assert {info.status for run_id, info in listed.items() if run_id not in (returning, asked_for)} == {"stale"}


def watch_scans(gcs_store: Any, tmp_path, crashed: int) -> tuple[int, int, list[str]]:
    """The dashboard's watch of a store: (calls of its first scan, of its next one, the live runs it shows)."""
    url = write_runs(gcs_store, f"watched-{crashed}", crashed, live=2)
    store = RunStore(url, spill_root=tmp_path / "unsent")
    requests = Requests(store)
    now = [0.0]
    watch = RunsDirectoryWatch(store, clock=lambda: now[0])
    watch.scan()
    first = requests.count
    now[0] += STORE_SCAN_SECONDS
    live = [info.run_id for info in watch.scan().live]
    return first, requests.count - first, sorted(live)


def test_the_dashboards_watch_of_a_store_of_crashed_runs_reads_each_once_then_only_the_live_ones(gcs_store, tmp_path):
    few = watch_scans(gcs_store, tmp_path, crashed=ONE_BY_ONE_RUNS + 2)
    many = watch_scans(gcs_store, tmp_path, crashed=4 * (ONE_BY_ONE_RUNS + 2))
    assert few[2] == many[2] == [live_id(0), live_id(1)]
    assert many[0] - few[0] == 3 * (ONE_BY_ONE_RUNS + 2)  # each crashed run's run.json, read once
    assert many[1] == few[1]  # then the live runs only
