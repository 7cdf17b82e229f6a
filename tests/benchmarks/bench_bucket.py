"""Runs in a bucket (issue 27): what a gs:// runs directory costs a user's ``fit``, History and ``tpudash watch``.

Everything runs against gcp-storage-emulator on 127.0.0.1, in a thread of
this process (``tests.object_stores.GcsEmulator``, one request at a time, in
memory), reached through gcsfs as a user's process reaches GCS
(``STORAGE_EMULATOR_HOST``, an anonymous token, gcsfs's own retries):

1. **The callback's cost in a store**: the ``fit`` of ``bench_callback``
   (the Colab walkthrough's CIFAR-10 CNN on the 8-replica CPU runtime,
   synthetic data, a one-epoch warm-up) with
   ``TpudashCallback(runs_dir=<temp dir>)`` against the same ``fit`` with
   ``TpudashCallback(runs_dir="gs://…")``, alternated local, gs, local, gs …;
   examples/s over the epochs after each fit's first (each several seconds,
   so several segments are sealed, every 2 s, and uploaded while it
   trains). After each, the run must say ``done`` with a batch point per
   recorded batch, read back from where it was written.
2. **History's first open of 1,000 runs**: 1,000 ended runs as a store
   writer lays them out (run.json, one events segment, one heartbeat: a run
   recorded by ``StoreRecorder``, its objects copied under 1,000 run ids with
   one ``fs.pipe``), then a fresh ``RunStore(url).list_runs()`` (fsspec's
   instances forgotten first, so the client starts cold), alternated with
   the same on the same 1,000 runs in a local directory; then a second
   ``list_runs()`` on the same store, which should cost one listing.
3. **A bucket of crashed runs, and one of many finished runs** (issue 37):
   2,000 runs whose writers crashed (run.json ``running``, one events
   segment, no heartbeat) and 100 live ones (a fresh heartbeat each) in one
   bucket; a fresh ``RunStore(url).list_runs()`` (the first call), then five
   more on the same store, each after the 100 live heartbeats were
   replaced as their writers replace them every 5 s (the next calls). Every
   crashed run must list ``stale``, every live one live. Beside it, 10,000
   finished runs (as in 2.), first and next call. Run these alone with
   ``TPUDASH_BENCH_BUCKET_PARTS=scale`` (the code: ``tests.benchmarks.bucket_scale``).
4. **Following a live run**: a writer records 20 events a second into
   gs:// for 30 s, then nothing for 30 s (its heartbeat goes on), then
   finishes; a ``RunFollower`` polls every 0.1 s as ``tpudash watch`` does,
   through a filesystem of its own so that only its requests are counted:
   per fsspec call (ls, info, open, cat_file, by folder) and per HTTP
   request gcsfs sends (list, object metadata, download), scaled to a
   minute. It must have read every event written, once.

HTTP requests are counted as gcsfs issues them (``GCSFileSystem._request``
of one instance): ``info`` asks two questions at once (the object, and a
one-item listing in case it is a folder), so it counts two.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tests.benchmarks.harness import Result, percentile

TARGET_RATIO = 0.98
FIRST_OPEN_TARGET_SECONDS = 2.0
LISTINGS_PER_MINUTE_TARGET = 60.0  # "lists only new segments, at most once a second"
QUIET_LISTING_GAP_SECONDS = 8.0  # segments.MAX_LIST_SECONDS: the back-off a quiet run reaches
EVENTS_PER_SECOND = 20.0


@dataclass(frozen=True)
class BucketSetup:
    runs: int  # in the bucket History opens
    open_rounds: int  # fresh opens per side
    live_seconds: float  # the writer records EVENTS_PER_SECOND for this long …
    quiet_seconds: float  # … then nothing for this long
    crashed_runs: int = 2_000  # in the bucket of crashed runs …
    live_runs: int = 100  # … beside these live ones
    finished_runs: int = 10_000  # in the bucket of finished runs


FULL = BucketSetup(runs=1_000, open_rounds=5, live_seconds=30.0, quiet_seconds=30.0)
QUICK = BucketSetup(
    runs=20, open_rounds=1, live_seconds=2.0, quiet_seconds=1.0, crashed_runs=40, live_runs=4, finished_runs=50
)


# -- the emulator and counting ------------------------------------------------------------------------


@contextlib.contextmanager
def gcs_emulator() -> Iterator[Any]:
    """A GCS emulator on 127.0.0.1 with this process's gcsfs pointed at it; spills go to a temp dir."""
    import fsspec.config
    import pytest

    from tests.object_stores import GcsEmulator, clear_filesystem_caches, plain_gcsfs

    with GcsEmulator() as server, pytest.MonkeyPatch.context() as patch:
        for name, value in server.environment().items():
            patch.setenv(name, value)
        # A store writer keeps its local files (and anything unsent) under $XDG_CACHE_HOME: not the user's.
        patch.setenv("XDG_CACHE_HOME", tempfile.mkdtemp(prefix="tpudash-bench-bucket-cache-"))
        patch.setitem(fsspec.config.conf, "gs", server.client_config())
        plain_gcsfs(patch)
        clear_filesystem_caches()
        try:
            yield server
        finally:
            clear_filesystem_caches()


def http_kind(method: str, path: str) -> str:
    """What a gcsfs request asks, from its method and path template (``b/{}/o`` is a listing)."""
    if "/upload/" in path:
        return "upload"
    if "/download/" in path:
        return "download"
    if method == "GET" and path.endswith("/o"):
        return "list"
    if method == "GET" and path.endswith("/o/{}"):
        return "metadata"
    return f"{method} {path}"


class HttpCounter:
    """Counts the HTTP requests one gcsfs filesystem instance sends, by kind."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def install(self, filesystem: Any) -> HttpCounter:
        original = filesystem._request  # the retrying request: one count per request asked, not per attempt

        async def counted(method, path, *args, **kwargs):
            self.counts[http_kind(method, path)] += 1
            return await original(method, path, *args, **kwargs)

        filesystem._request = counted
        return self

    def snapshot(self) -> Counter[str]:
        return Counter(self.counts)


class CountingFilesystem:
    """A filesystem's public calls counted by method and the run folder they touch (``ls events``)."""

    def __init__(self, inner: Any, root: str) -> None:
        self.inner = inner
        self.root = root.rstrip("/")
        self.calls: Counter[str] = Counter()
        self.listed_at: dict[str, list[float]] = {}

    def _where(self, path: Any) -> str:
        relative = str(path).split(self.root, 1)[-1].strip("/").split("/")
        return relative[1] if len(relative) > 1 else "(runs)"  # <run id>/<folder or file>/…

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name.startswith("_") or not callable(attribute):
            return attribute

        def call(path, *args, **kwargs):
            where = self._where(path)
            self.calls[f"{name} {where}"] += 1
            if name == "ls":
                self.listed_at.setdefault(where, []).append(time.monotonic())
            return attribute(path, *args, **kwargs)

        return call


def difference(after: Counter[str], before: Counter[str]) -> dict[str, int]:
    return {key: after[key] - before[key] for key in sorted(after) if after[key] - before[key]}


def per_minute(counts: dict[str, int], seconds: float) -> dict[str, float]:
    return {key: round(value * 60.0 / seconds, 1) for key, value in counts.items()}


def new_bucket(server: Any) -> str:
    bucket = server.new_bucket_name("bench")
    server.make_bucket(bucket)
    return bucket


# -- 1. the callback's fit, local against gs:// --------------------------------------------------------


def recorded_run(runs_dir: Path | str, run_id: str, epochs: int) -> dict:
    """The callback's run read back from where it was written: done, with examples/s for every epoch."""
    from tpudash.runs.store import RunStore

    data = RunStore(runs_dir).load(run_id)
    if data.info.status != "done":
        raise RuntimeError(f"{data.info.path}: status {data.info.status!r}, not 'done' ({data.info.error})")
    names = Counter(metric.name for _, metric in data.metrics())
    if names["examples_per_second"] != epochs:
        raise RuntimeError(f"{data.info.path}: {names['examples_per_second']} examples/s metrics for {epochs} epochs")
    return {"run_id": run_id, "batch_points": names["batch_loss"], "events": len(data.events)}


def measure_fit(server: Any, quick: bool) -> list[Result]:
    from tests.benchmarks.bench_callback import prepare, train
    from tpudash.callbacks import TpudashCallback

    setup, strategy, global_batch, data, model, parameters = prepare(quick)
    local_dir = Path(tempfile.mkdtemp(prefix="tpudash-bench-bucket-runs-"))
    store_url = f"gs://{new_bucket(server)}/runs"
    model.fit(data, epochs=1, steps_per_epoch=setup.steps_per_epoch, verbose=0, shuffle=False)  # warm-up
    trials: dict[str, list] = {"local": [], "gs": []}
    recorded: dict[str, list[dict]] = {"local": [], "gs": []}
    for trial in range(setup.trials):
        for side, runs_dir in (("local", local_dir), ("gs", store_url)):
            callback = TpudashCallback(runs_dir=runs_dir, batch_size=global_batch)
            trials[side].append(train(model, data, setup, global_batch, [callback]))
            assert callback.run is not None
            recorded[side].append(recorded_run(runs_dir, callback.run.run_id, setup.epochs))
        print(
            f"[bucket] fit trial {trial + 1}/{setup.trials}: local {trials['local'][-1].examples_per_second:,.0f} "
            f"ex/s, gs:// {trials['gs'][-1].examples_per_second:,.0f} ex/s",
            file=sys.stderr,
            flush=True,
        )
    gc.collect()
    rates = {side: [t.examples_per_second for t in runs] for side, runs in trials.items()}
    fits = {side: [t.fit_seconds for t in runs] for side, runs in trials.items()}
    local_rate, gs_rate = statistics.median(rates["local"]), statistics.median(rates["gs"])
    paired = [gs / local for gs, local in zip(rates["gs"], rates["local"])]
    ratio = gs_rate / local_rate
    points = statistics.median(r["batch_points"] for r in recorded["gs"])
    notes = (
        f"{parameters:,}-parameter CNN, {int(strategy.num_replicas_in_sync)} replicas, global batch {global_batch}, "
        f"{setup.steps_per_epoch} steps × {setup.epochs - 1} timed epochs, {setup.trials} fits per side alternated; "
        f"local {min(rates['local']):,.0f}–{max(rates['local']):,.0f} ex/s, gs:// {min(rates['gs']):,.0f}–"
        f"{max(rates['gs']):,.0f}; paired ratios {min(paired):.3f}–{max(paired):.3f} "
        f"(median {statistics.median(paired):.3f}); {points:.0f} batch points per gs:// run, read back done"
    )
    fit_local, fit_gs = statistics.median(fits["local"]), statistics.median(fits["gs"])
    fit_ratio = fit_gs / fit_local
    return [
        Result(
            benchmark="bucket",
            figure="fit with TpudashCallback into gs:// (emulator), examples/s",
            value=gs_rate,
            unit="ex/s",
            baseline_name="the same into a local dir",
            baseline=local_rate,
            ratio=ratio,
            target=f"≥ {TARGET_RATIO} ×",
            met=ratio >= TARGET_RATIO,
            samples={"examples_per_second": rates, "paired_ratios": paired, "recorded": recorded},
            notes=notes,
        ),
        Result(
            benchmark="bucket",
            figure=f"whole fit call ({setup.epochs} epochs) into gs:// ÷ into a local dir (informative)",
            value=fit_ratio,
            unit="×",
            samples={"fit_seconds": fits},
            notes=f"medians {fit_gs:.2f} s into gs://, {fit_local:.2f} s into a local dir: run creation, the "
            "model's description and the finish (the last segment and run.json uploaded, at most 10 s) included",
        ),
    ]


# -- 2. History's first open ---------------------------------------------------------------------------


def template_run(store_url: str) -> tuple[str, dict[str, bytes]]:
    """One ended run written by ``StoreRecorder`` (its run id, and its objects by path within the run)."""
    from jobs.events import Metric, Progress, RunFinished, RunStarted
    from tpudash.runs.layout import SOURCE_CALLBACK
    from tpudash.runs.store import RunStore

    store = RunStore(store_url, spill_root=Path(tempfile.mkdtemp(prefix="tpudash-bench-bucket-spill-")))
    run_id = "20260101-000000-train-000000"
    params = {"dataset": "cifar10", "model": "cifar-cnn", "epochs": 3, "batch_per_replica": 16}
    recorder = store.create(run_id, "train", params, {"replicas": 8}, source=SOURCE_CALLBACK)
    recorder.record(RunStarted(run_id, "train", params, {"replicas": 8}, time.time()))
    for epoch in range(1, 4):
        for step in range(1, 11):
            recorder.record(Metric("batch_loss", 2.0 / (epoch * step), (epoch - 1) * 10 + step, epoch=epoch))
        recorder.record(Metric("loss", 1.0 / epoch, epoch * 10, epoch=epoch))
        recorder.record(Metric("loss", 1.1 / epoch, epoch * 10, epoch=epoch, split="val"))
        recorder.record(Progress(epoch, 3, "epoch"))
    recorder.record(RunFinished(status="done", summary={"epochs": 3}))
    filesystem, prefix = store.backend.filesystem, f"{store.backend.root}/{run_id}"
    objects = {path.split(prefix + "/", 1)[1]: filesystem.cat_file(path) for path in filesystem.find(prefix)}
    folders = sorted({name.split("/")[0] for name in objects})
    if folders != ["events", "run.json", "writers"]:
        raise RuntimeError(f"the template run holds {sorted(objects)}: not run.json, one segment and a heartbeat")
    return run_id, objects


def ended_run_copies(store_url: str, count: int) -> tuple[Any, str, dict[str, bytes]]:
    """``count`` copies of one ended run, a minute apart from 2026-01-01: (filesystem, root, {key: body}).

    Keys are relative to the runs directory (``<run id>/<name>``); the template run is written to
    ``<store_url>-template`` first, so what is copied is a real run's files.
    """
    from tpudash.runs.location import open_filesystem

    template_id, objects = template_run(store_url + "-template")
    filesystem, root = open_filesystem(store_url)
    started = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
    copies: dict[str, bytes] = {}
    for index in range(count):
        stamp = datetime.fromtimestamp(started + 60 * index, tz=timezone.utc)
        run_id = f"{stamp:%Y%m%d-%H%M%S}-train-{index:06x}"
        for name, data in objects.items():
            copies[f"{run_id}/{name}"] = data.replace(template_id.encode(), run_id.encode())
    return filesystem, root, copies


def thousand_runs(store_url: str, local_dir: Path, count: int) -> dict:
    """``count`` ended runs in the store (one ``pipe``) and the same in ``local_dir``."""
    filesystem, root, copies = ended_run_copies(store_url, count)
    for key, body in copies.items():
        (local_dir / key).parent.mkdir(parents=True, exist_ok=True)
        (local_dir / key).write_bytes(body)
    batch = {f"{root}/{key}": body for key, body in copies.items()}
    written = time.perf_counter()
    filesystem.pipe(batch)
    return {
        "objects": len(batch),
        "bytes": sum(map(len, batch.values())),
        "pipe_seconds": time.perf_counter() - written,
    }


def open_fresh(runs_dir: Path | str) -> tuple[float, int, HttpCounter, Any]:
    """A fresh RunStore's first list_runs: (seconds, runs listed, its HTTP requests so far, the store)."""
    from tests.object_stores import clear_filesystem_caches
    from tpudash.runs.store import RunStore

    clear_filesystem_caches()
    gc.collect()
    started = time.perf_counter()
    store = RunStore(runs_dir)
    counter = HttpCounter().install(store.backend.filesystem) if not store.local else HttpCounter()
    runs = store.list_runs()
    seconds = time.perf_counter() - started
    if any(info.status != "done" or info.problems for info in runs):
        bad = next(info for info in runs if info.status != "done" or info.problems)
        raise RuntimeError(f"{bad.path}: listed {bad.status} {bad.problems}, not done")
    return seconds, len(runs), counter, store


def measure_first_open(server: Any, setup: BucketSetup) -> list[Result]:
    bucket = new_bucket(server)
    store_url = f"gs://{bucket}/runs"
    local_dir = Path(tempfile.mkdtemp(prefix="tpudash-bench-bucket-local-"))
    written = thousand_runs(store_url, local_dir, setup.runs)
    print(
        f"[bucket] {setup.runs:,} runs written: {written['objects']:,} objects, {written['bytes'] / 1e6:.1f} MB "
        f"in {written['pipe_seconds']:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    seconds: dict[str, list[float]] = {"gs": [], "local": []}
    requests: list[dict[str, int]] = []
    again_seconds, again_requests = [], []
    for _ in range(setup.open_rounds):
        took, listed, counter, store = open_fresh(store_url)
        if listed != setup.runs:
            raise RuntimeError(f"{store_url}: list_runs found {listed} runs of {setup.runs}")
        seconds["gs"].append(took)
        requests.append(dict(counter.counts))
        before = counter.snapshot()
        started = time.perf_counter()
        store.list_runs()
        again_seconds.append(time.perf_counter() - started)
        again_requests.append(difference(counter.snapshot(), before))
        took, listed, _, _ = open_fresh(local_dir)
        seconds["local"].append(took)
    first, local = statistics.median(seconds["gs"]), statistics.median(seconds["local"])
    again = statistics.median(again_seconds)
    total_first = statistics.median(sum(counts.values()) for counts in requests)
    total_again = statistics.median(sum(counts.values()) for counts in again_requests)
    listing_only = all(set(counts) <= {"list"} for counts in again_requests)
    return [
        Result(
            benchmark="bucket",
            figure=f"History's first list_runs, {setup.runs:,} ended runs in gs:// (fresh client)",
            value=first,
            unit="s",
            baseline_name="the same runs in a local dir",
            baseline=local,
            ratio=first / local,
            target=f"≤ {FIRST_OPEN_TARGET_SECONDS:g} s",
            met=first <= FIRST_OPEN_TARGET_SECONDS,
            samples={"seconds": seconds, "requests": requests, "written": written},
            notes=f"median of {setup.open_rounds} fresh opens ({min(seconds['gs']):.2f}–{max(seconds['gs']):.2f} s), "
            f"{total_first:.0f} HTTP requests each ({requests[0]}); {written['objects']:,} objects "
            f"({written['bytes'] / 1e6:.1f} MB) in the bucket",
        ),
        Result(
            benchmark="bucket",
            figure=f"second list_runs on the same store ({setup.runs:,} runs), HTTP requests",
            value=float(total_again),
            unit="requests",
            baseline_name="the first list_runs",
            baseline=float(total_first),
            ratio=total_again / total_first,
            target="listings only",
            met=listing_only,
            samples={"seconds": again_seconds, "requests": again_requests},
            notes=f"{again * 1000:.0f} ms (median; {min(again_seconds) * 1000:.0f}–{max(again_seconds) * 1000:.0f}); "
            f"requests {again_requests[0]}",
        ),
    ]


# -- 4. following a live run ---------------------------------------------------------------------------


class Writer(threading.Thread):
    """Records EVENTS_PER_SECOND metrics into a store run until ``quiet`` is set, then waits for ``finish``."""

    def __init__(self, store: Any, run_id: str) -> None:
        super().__init__(name="bench-bucket-writer", daemon=True)
        from jobs.events import RunStarted

        self.recorder = store.create(run_id, "train", {"epochs": 1}, {})
        self.recorder.record(RunStarted(run_id, "train", {"epochs": 1}, {}, time.time()))
        self.written = 1
        self.quiet, self.finish = threading.Event(), threading.Event()

    def run(self) -> None:
        from jobs.events import Metric, Progress, RunFinished

        started, step = time.monotonic(), 0
        while not self.quiet.is_set():
            step += 1
            self.recorder.record(Metric("batch_loss", 1.0 / step, step, epoch=1 + step // 200))
            self.written += 1
            if step % 200 == 0:  # an "epoch" every 10 s: run.json is replaced then, as a fit's callback does
                self.recorder.record(Progress(step // 200, None, "epoch"))
                self.written += 1
            self.quiet.wait(max(0.0, started + step / EVENTS_PER_SECOND - time.monotonic()))
        self.finish.wait(600)
        self.recorder.record(RunFinished(status="done"))
        self.written += 1


def follow_for(follower: Any, seconds: float, seen: list[tuple[float, float | None]]) -> None:
    """Poll as ``tpudash watch`` does (every POLL_SECONDS) for ``seconds``, noting when each event arrived."""
    from tpudash.runs.follow import POLL_SECONDS

    deadline = time.monotonic() + seconds
    pause = threading.Event()
    while time.monotonic() < deadline and not follower.ended:
        for stamp, _event in follower.poll():
            seen.append((time.time(), stamp))
        pause.wait(POLL_SECONDS)


def measure_follow(server: Any, setup: BucketSetup) -> list[Result]:
    from tpudash.runs.follow import RunFollower
    from tpudash.runs.layout import new_run_id
    from tpudash.runs.store import RunStore

    store_url = f"gs://{new_bucket(server)}/runs"
    writer_store = RunStore(store_url, spill_root=Path(tempfile.mkdtemp(prefix="tpudash-bench-bucket-spill-")))
    run_id = new_run_id("train")
    writer = Writer(writer_store, run_id)
    writer.recorder.record_uploaded.wait(20)  # run.json goes up on the recorder's own thread
    writer_http = HttpCounter().install(writer_store.backend.filesystem)
    writer.start()

    follower_store = RunStore(store_url)
    shared = follower_store.backend.filesystem
    own = type(shared)(**shared.storage_options, skip_instance_cache=True)  # the writer's requests not counted
    follower_http = HttpCounter().install(own)
    counting = CountingFilesystem(own, follower_store.backend.root)
    follower_store.backend.filesystem = counting
    follower = RunFollower(follower_store, run_id)
    opened = (follower_http.snapshot(), Counter(counting.calls))
    seen: list[tuple[float, float | None]] = []

    phases: dict[str, dict] = {}
    for phase, seconds in (("live", setup.live_seconds), ("quiet", setup.quiet_seconds)):
        before = (follower_http.snapshot(), Counter(counting.calls), writer_http.snapshot(), time.monotonic())
        phase_started = before[3]
        follow_for(follower, seconds, seen)
        if phase == "live":
            writer.quiet.set()
            writer_events = writer.written
        took = time.monotonic() - before[3]
        phases[phase] = {
            "seconds": took,
            "http": difference(follower_http.snapshot(), before[0]),
            "calls": difference(Counter(counting.calls), before[1]),
            "writer_http": difference(writer_http.snapshot(), before[2]),
        }
    listed = [moment for moment in counting.listed_at.get("events", []) if moment >= phase_started]  # the quiet's
    quiet_gaps = [later - earlier for earlier, later in zip(listed, listed[1:])]
    writer.finish.set()
    writer.join(timeout=60)
    follow_for(follower, 30, seen)  # to the run's end: every event must have arrived
    if not follower.ended or len(seen) != writer.written:
        raise RuntimeError(f"the follower read {len(seen)} events of {writer.written} (ended: {follower.ended})")
    lags = [arrived - stamp for arrived, stamp in seen[:writer_events] if stamp is not None]
    return [follow_row(phase, data, setup, lags, quiet_gaps, opened) for phase, data in phases.items()]


def follow_row(phase: str, data: dict, setup: BucketSetup, lags: list[float], gaps: list[float], opened) -> Result:
    seconds = data["seconds"]
    http = data["http"]
    rate = sum(http.values()) * 60.0 / seconds
    events_listings = data["calls"].get("ls events", 0) * 60.0 / seconds
    common = {
        "follower_http": http,
        "follower_calls": data["calls"],
        "writer_http": data["writer_http"],
        "seconds": seconds,
        "follower_http_per_minute": per_minute(http, seconds),
        "follower_calls_per_minute": per_minute(data["calls"], seconds),
        "writer_http_per_minute": per_minute(data["writer_http"], seconds),
    }
    where = (
        f"follower per minute: HTTP {per_minute(http, seconds)}; fsspec calls {per_minute(data['calls'], seconds)}; "
        f"the writer meanwhile sent {sum(data['writer_http'].values()) * 60.0 / seconds:.0f} requests/min "
        f"{per_minute(data['writer_http'], seconds)}"
    )
    if phase == "live":
        return Result(
            benchmark="bucket",
            figure=f"follower's HTTP requests/min, live run ({EVENTS_PER_SECOND:g} events/s, {seconds:.0f} s)",
            value=rate,
            unit="req/min",
            target=f"events listed ≤ {LISTINGS_PER_MINUTE_TARGET:g}/min",
            met=events_listings <= LISTINGS_PER_MINUTE_TARGET,
            samples={**common, "lag_seconds": lags, "opening_http": dict(opened[0]), "opening_calls": dict(opened[1])},
            notes=f"{where}; events listed {events_listings:.0f}/min; an event reached the follower "
            f"{statistics.median(lags):.1f} s after it was recorded (median; p95 {percentile(lags, 0.95):.1f}, "
            f"max {max(lags):.1f}); opening the run (find, info) cost {sum(opened[0].values())} requests",
        )
    return Result(
        benchmark="bucket",
        figure=f"follower's HTTP requests/min, quiet run (nothing new for {seconds:.0f} s)",
        value=rate,
        unit="req/min",
        target=f"listings back off to every {QUIET_LISTING_GAP_SECONDS:g} s",
        met=bool(gaps) and max(gaps) >= QUIET_LISTING_GAP_SECONDS - 0.5,
        samples={**common, "events_listing_gaps": gaps},
        notes=f"{where}; gaps between events listings {[round(gap, 1) for gap in gaps]} s "
        f"(from the writer's last event, the run's last segment sealed ≤ 2 s later)",
    )


def run(quick: bool) -> list[Result]:
    import os

    setup = QUICK if quick else FULL
    parts = set(os.environ.get("TPUDASH_BENCH_BUCKET_PARTS", "fit,open,scale,follow").split(","))
    results: list[Result] = []
    with gcs_emulator() as server:
        if "open" in parts:
            results += measure_first_open(server, setup)
        if "scale" in parts:
            from tests.benchmarks.bucket_scale import measure_scale

            results += measure_scale(server, setup)
        if "follow" in parts:
            results += measure_follow(server, setup)
        if "fit" in parts:
            results = measure_fit(server, quick) + results
    return results
