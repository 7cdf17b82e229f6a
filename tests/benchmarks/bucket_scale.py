"""The bucket benchmark's rows of issue 37: a bucket of crashed runs, and one of many finished runs.

2,000 runs whose writers crashed (run.json ``running``, one events segment,
no heartbeat) and 100 live ones (a fresh heartbeat each) in one bucket of
the emulator; a fresh ``RunStore(url).list_runs()`` (the first call), then
``NEXT_CALLS`` more on the same store, each after the 100 live heartbeats
were replaced as their writers replace them every 5 s (the next calls).
Every crashed run must list ``stale``, every live one live. Beside it,
10,000 finished runs, first and next call. Wall time, CPU time of this
process (the client and the emulator's thread) and HTTP requests, per call.
Run by ``bench_bucket`` (``TPUDASH_BENCH_BUCKET_PARTS=scale`` for these alone).
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from typing import Any

from tests.benchmarks.bench_bucket import (
    FIRST_OPEN_TARGET_SECONDS,
    BucketSetup,
    HttpCounter,
    difference,
    new_bucket,
    template_run,
)
from tests.benchmarks.harness import Result

NEXT_CALL_TARGET_SECONDS = 0.5
NEXT_CALLS = 5
UPLOAD_BATCH = 400  # objects per fs.pipe: each call must finish within the store timeout


def upload(filesystem: Any, objects: dict[str, bytes]) -> float:
    """``objects`` written in batches (one ``pipe`` each); the seconds it took."""
    started = time.perf_counter()
    items = list(objects.items())
    for first in range(0, len(items), UPLOAD_BATCH):
        filesystem.pipe(dict(items[first : first + UPLOAD_BATCH]))
    return time.perf_counter() - started


def heartbeat_bytes() -> bytes:
    import json

    return json.dumps({"heartbeat": round(time.time(), 3), "interval": 5.0, "host": "elsewhere"}).encode()


def crashed_and_live_runs(store_url: str, crashed: int, live: int) -> tuple[dict, list[str]]:
    """``crashed`` runs left ``running`` with no heartbeat and ``live`` beating ones; (what was written, heartbeat paths)."""
    import json

    from tpudash.runs.location import open_filesystem

    template_id, objects = template_run(store_url + "-template")
    filesystem, root = open_filesystem(store_url)
    started = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
    batch: dict[str, bytes] = {}
    heartbeats = []
    for index in range(crashed + live):
        stamp = datetime.fromtimestamp(started + 60 * index, tz=timezone.utc)
        run_id = f"{stamp:%Y%m%d-%H%M%S}-train-{index:06x}"
        for name, data in objects.items():
            if name.startswith("writers/"):
                continue
            body = data.replace(template_id.encode(), run_id.encode())
            if name == "run.json":
                meta = json.loads(body)
                meta.update(status="running", finished=None, host="elsewhere")
                body = json.dumps(meta).encode()
            batch[f"{root}/{run_id}/{name}"] = body
        if index >= crashed:
            heartbeats.append(f"{root}/{run_id}/writers/w-{index:06x}.json")
            batch[heartbeats[-1]] = heartbeat_bytes()
    seconds = upload(filesystem, batch)
    return {"objects": len(batch), "bytes": sum(map(len, batch.values())), "pipe_seconds": seconds}, heartbeats


def finished_runs(store_url: str, count: int) -> dict:
    """``count`` ended runs as in 2. (no local copy)."""
    from tpudash.runs.location import open_filesystem

    template_id, objects = template_run(store_url + "-template")
    filesystem, root = open_filesystem(store_url)
    started = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
    batch: dict[str, bytes] = {}
    for index in range(count):
        stamp = datetime.fromtimestamp(started + 60 * index, tz=timezone.utc)
        run_id = f"{stamp:%Y%m%d-%H%M%S}-train-{index:06x}"
        for name, data in objects.items():
            batch[f"{root}/{run_id}/{name}"] = data.replace(template_id.encode(), run_id.encode())
    seconds = upload(filesystem, batch)
    return {"objects": len(batch), "bytes": sum(map(len, batch.values())), "pipe_seconds": seconds}


def timed_list(store: Any, counter: HttpCounter) -> tuple[float, float, list, dict[str, int]]:
    """(wall seconds, CPU seconds of this process: the client and the emulator's thread, runs, HTTP requests)."""
    before = counter.snapshot()
    started, cpu = time.perf_counter(), time.process_time()
    runs = store.list_runs()
    return time.perf_counter() - started, time.process_time() - cpu, runs, difference(counter.snapshot(), before)


def first_and_next(store_url: str, check: Any, between: Any = None) -> dict:
    """A fresh store's first list_runs, then NEXT_CALLS more (``between`` runs before each, untimed)."""
    from tests.object_stores import clear_filesystem_caches
    from tpudash.runs.store import RunStore

    clear_filesystem_caches()
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    store = RunStore(store_url)
    counter = HttpCounter().install(store.backend.filesystem.unwrapped)
    runs = store.list_runs()
    first, first_cpu = time.perf_counter() - started, time.process_time() - cpu
    first_requests = dict(counter.counts)
    check(runs)
    next_seconds, next_cpu, next_requests = [], [], []
    for _ in range(NEXT_CALLS):
        if between is not None:
            between()
        seconds, cpu_seconds, runs, requests = timed_list(store, counter)
        check(runs)
        next_seconds.append(seconds)
        next_cpu.append(cpu_seconds)
        next_requests.append(requests)
    return {
        "first": first,
        "first_cpu": first_cpu,
        "first_requests": first_requests,
        "next": next_seconds,
        "next_cpu": next_cpu,
        "next_requests": next_requests,
    }


def measure_scale(server: Any, setup: BucketSetup) -> list[Result]:
    from tpudash.runs.location import open_filesystem

    crashed_url = f"gs://{new_bucket(server)}/runs"
    written, heartbeats = crashed_and_live_runs(crashed_url, setup.crashed_runs, setup.live_runs)
    print(
        f"[bucket] {setup.crashed_runs:,} crashed + {setup.live_runs:,} live runs written: {written['objects']:,} "
        f"objects in {written['pipe_seconds']:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    filesystem, _ = open_filesystem(crashed_url)

    def beat_again() -> None:  # what the live writers do every 5 s
        upload(filesystem, {path: heartbeat_bytes() for path in heartbeats})

    def check_crashed(runs: list) -> None:
        seen = Counter((info.status, info.live) for info in runs)
        wanted = {("stale", False): setup.crashed_runs, ("running", True): setup.live_runs}
        if seen != wanted:
            raise RuntimeError(f"{crashed_url}: listed {dict(seen)}, not {wanted}")

    crashed = first_and_next(crashed_url, check_crashed, beat_again)
    finished_url = f"gs://{new_bucket(server)}/runs"
    finished_written = finished_runs(finished_url, setup.finished_runs)
    print(
        f"[bucket] {setup.finished_runs:,} finished runs written: {finished_written['objects']:,} objects "
        f"in {finished_written['pipe_seconds']:.1f} s",
        file=sys.stderr,
        flush=True,
    )

    def check_finished(runs: list) -> None:
        if len(runs) != setup.finished_runs or any(info.status != "done" for info in runs):
            raise RuntimeError(f"{finished_url}: listed {Counter(info.status for info in runs)}")

    finished = first_and_next(finished_url, check_finished)
    results = []
    for what, figures, bucket_words in (
        ("crashed", crashed, f"{setup.crashed_runs:,} crashed + {setup.live_runs:,} live runs"),
        ("finished", finished, f"{setup.finished_runs:,} finished runs"),
    ):
        next_median = statistics.median(figures["next"])
        print(
            f"[bucket] {bucket_words}: first list_runs {figures['first']:.2f} s (CPU {figures['first_cpu']:.2f} s; "
            f"{sum(figures['first_requests'].values())} HTTP requests {figures['first_requests']}); next "
            f"{', '.join(f'{seconds:.3f}' for seconds in figures['next'])} s "
            f"(CPU {', '.join(f'{seconds:.3f}' for seconds in figures['next_cpu'])} s; "
            f"requests {[sum(counts.values()) for counts in figures['next_requests']]})",
            file=sys.stderr,
            flush=True,
        )
        results += [
            Result(
                benchmark="bucket",
                figure=f"first list_runs, {bucket_words} in gs:// (fresh client)",
                value=figures["first"],
                unit="s",
                target=f"≤ {FIRST_OPEN_TARGET_SECONDS:g} s" if what == "crashed" else "",
                met=figures["first"] <= FIRST_OPEN_TARGET_SECONDS if what == "crashed" else None,
                samples={"requests": figures["first_requests"]},
                notes=f"CPU {figures['first_cpu']:.2f} s (this process: client and emulator); "
                f"{sum(figures['first_requests'].values())} HTTP requests {figures['first_requests']}",
            ),
            Result(
                benchmark="bucket",
                figure=f"next list_runs, {bucket_words} in gs://"
                + (" (live heartbeats replaced before each)" if what == "crashed" else ""),
                value=next_median,
                unit="s",
                target=f"≤ {NEXT_CALL_TARGET_SECONDS:g} s",
                met=next_median <= NEXT_CALL_TARGET_SECONDS,
                samples={"seconds": figures["next"], "requests": figures["next_requests"]},
                notes=f"median of {NEXT_CALLS} ({min(figures['next']):.3f}–{max(figures['next']):.3f} s; CPU median "
                f"{statistics.median(figures['next_cpu']):.3f} s, client and emulator); HTTP "
                f"requests {[sum(counts.values()) for counts in figures['next_requests']]}, "
                f"first {figures['next_requests'][0]}",
            ),
        ]
    return results
