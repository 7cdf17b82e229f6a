"""The Hosts view under 64 agents: key p95 and the redraw time, against the same dashboard on Devices with none.

64 simulated agents write into one bucket (the GCS emulator on 127.0.0.1,
as bench_bucket uses it): each replaces its ``hosts/<name>/host.json``
(``tpudash.runs.hosts.host_record``, 4 TPU chips) every
``HOST_INTERVAL_SECONDS``, at its own phase, and adds a sample segment
(``samples/bench-<seq>.jsonl``) with it. They run in a thread of this
process, so their writes and the emulator's HTTP serving take this
process's time too: a pessimistic setting for the dashboard.

The dashboard (``TpudashApp`` under Pilot, 120×40, headless, its engine an
in-process thread on a fixed runtime as the snapshot tests have: no
TensorFlow anywhere) runs in two setups, alternated round by round (A B A B):

- **A**: runs dir = the bucket, 64 agents writing, the Hosts view shown
  (it reads every host every 2 s off the UI thread); presses ``j`` then
  ``n``, two UI ticks apart, each timed from the key entering the app's
  queue to the first frame of the new screen (bench_key_latency's
  ``FrameClock``).
- **B**: runs dir = an empty local directory, no agents, on Devices;
  presses ``j`` then ``d`` the same way.

Figures: key p95 in A and B and their ratio; the Hosts redraw time (the UI
thread's handling of one read of 64 hosts: cells, in-place updates) p50/p95
and max; and the read time of the 64 host.json (off the UI thread).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path

from tests.benchmarks.bench_bucket import gcs_emulator, new_bucket
from tests.benchmarks.bench_key_latency import SCREEN_FOR_KEY, FrameClock
from tests.benchmarks.harness import Result, median, percentile

HOSTS = 64
CHIPS_PER_HOST = 4
GIB = 1024**3
APP_SIZE = (120, 40)
TARGET_RATIO = 1.5
TIMEOUT = 120.0
SCREEN_FOR_KEY = {**SCREEN_FOR_KEY, "n": "HostsScreen"}


class SimulatedAgents:
    """``count`` agents writing host.json and a sample segment each, every interval, at their own phases."""

    def __init__(self, runs_dir: str, count: int, interval: float):
        from tpudash.runs.backends import runs_root

        self.root = runs_root(runs_dir)
        self.count, self.interval = count, interval
        self.stop = threading.Event()
        self.writes = 0
        self.thread = threading.Thread(target=self._run, name="bench simulated agents", daemon=True)

    def __enter__(self) -> SimulatedAgents:
        for index in range(self.count):  # every host reports before the first measurement
            self.write(index, 0)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(TIMEOUT)

    def write(self, index: int, tick: int) -> None:
        from tpudash.runs.hosts import ChipStatus, HostStatus, host_record

        name = f"tpu-vm-{index:02d}"
        duty = [float((index * 7 + tick * 13 + chip * 29) % 100) for chip in range(CHIPS_PER_HOST)]
        status = HostStatus(
            name=name,
            hostname=f"{name}.internal",
            heartbeat=time.time(),
            interval=self.interval,
            cpu_percent=float((index + tick) % 100),
            memory_used=int((40 + tick % 5) * GIB),
            memory_total=188 * GIB,
            chips=tuple(ChipStatus(chip, duty[chip], int((2 + duty[chip] / 10) * GIB), 16 * GIB) for chip in range(4)),
            runs=(),
            problem=None,
        )
        filesystem, prefix = self.root.filesystem, f"{self.root.root}/hosts/{name}"
        filesystem.pipe_file(f"{prefix}/host.json", host_record(status))
        sample = {"t": status.heartbeat, "cpu": status.cpu_percent, "duty": duty}
        filesystem.pipe_file(f"{prefix}/samples/bench-{tick:06d}.jsonl", (json.dumps(sample) + "\n").encode())
        self.writes += 1

    def _run(self) -> None:
        started, slot = time.monotonic(), 0
        spacing = self.interval / self.count
        while not self.stop.is_set():
            slot += 1
            self.stop.wait(max(0.0, started + slot * spacing - time.monotonic()))
            if not self.stop.is_set():
                self.write(slot % self.count, slot // self.count)


def make_app(runs_dir: Path | str):
    from jobs import registry
    from tests.functional.test_snapshots import DESCRIPTION, FixedHostCheck
    from tpudash.accel.description import Runtime
    from tpudash.config import Settings
    from tpudash.engine.inthread import EngineThread
    from tpudash.tui.app import TpudashApp

    runtime = Runtime(strategy=None, description=DESCRIPTION)
    data_dir = Path(tempfile.mkdtemp(prefix="tpudash-bench-hosts-data-"))
    settings = Settings(cpu_devices=8, runs_dir=runs_dir, data_dir=data_dir, telemetry_interval=0)
    specs = registry()
    return TpudashApp(
        settings,
        engine_factory=lambda listener: EngineThread(listener, settings, specs, lambda: runtime),
        host_check_provider=FixedHostCheck,
        job_specs=specs,
    )


async def presses(runs_dir: Path | str, home: str, count: int) -> tuple[list[float], list[float], int]:
    """A fresh app on ``home`` (after a warm-up visit of every key): ``count`` timed presses of j and ``home``.

    Returns the latencies, the Hosts screen's redraw times, and how many hosts it last showed.
    """
    app = make_app(runs_dir)
    latencies: list[float] = []
    async with app.run_test(size=APP_SIZE) as pilot:
        await asyncio.wait_for(app.runtime_settled.wait(), TIMEOUT)
        clock = FrameClock(app)
        for key in ("j", home, "j", home):  # the warm-up: each screen built and shown once
            await pilot.press(key)
            await app.workers.wait_for_complete()
            await app.next_tick()
        for index in range(count):
            key = "j" if index % 2 == 0 else home
            awaited = SCREEN_FOR_KEY[key]
            if type(app.screen).__name__ == awaited:
                continue
            latencies.append(await asyncio.wait_for(press(clock, key, awaited), TIMEOUT))
            await app.next_tick()
            await app.next_tick()
        if type(app.screen).__name__ != SCREEN_FOR_KEY[home]:
            await pilot.press(home)
        screen = app.screen
        redraws: list[float] = []
        shown = 0
        if home == "n":  # one more read while shown: the Hosts view has read the store at least once
            worker = screen.read_now()
            if worker is not None:
                await asyncio.wait_for(worker.wait(), TIMEOUT)
            await pilot.pause()
            redraws, shown = list(screen.redraw_seconds), len(screen.hosts)
    return latencies, redraws, shown


async def press(clock: FrameClock, key: str, awaited: str) -> float:
    """FrameClock.press for a key of this benchmark's own (``n``)."""
    from textual import events

    key_event = events.Key(key, key)
    key_event.set_sender(clock.app)
    clock.awaited = awaited
    clock.drawn.clear()
    started = time.perf_counter()
    clock.app._driver.send_message(key_event)
    await clock.drawn.wait()
    return clock.drawn_at - started


def read_seconds(runs_dir: str, rounds: int) -> list[float]:
    """The off-thread part: one HostsReader.read of every host, timed."""
    from tpudash.runs.hosts import HostsReader

    reader, seconds = HostsReader(runs_dir), []
    for _ in range(rounds):
        started = time.perf_counter()
        hosts = reader.read()
        seconds.append(time.perf_counter() - started)
        if len(hosts) != HOSTS:
            raise RuntimeError(f"read {len(hosts)} hosts of {HOSTS}: {reader.problems[:3]}")
    return seconds


def run(quick: bool) -> list[Result]:
    from tpudash.runs.hosts import HOST_INTERVAL_SECONDS

    rounds, count = (1, 6) if quick else (3, 30)
    hosts_latencies: list[float] = []
    devices_latencies: list[float] = []
    redraws: list[float] = []
    shown = 0
    with gcs_emulator() as server:
        store = f"gs://{new_bucket(server)}/runs"
        with SimulatedAgents(store, HOSTS, HOST_INTERVAL_SECONDS) as agents:
            reads = read_seconds(store, 3 if quick else 10)
            for _ in range(rounds):  # A B A B
                latencies, drawn, shown = asyncio.run(presses(store, "n", count))
                hosts_latencies += latencies
                redraws += drawn
                empty = Path(tempfile.mkdtemp(prefix="tpudash-bench-hosts-none-"))
                devices_latencies += asyncio.run(presses(empty, "d", count))[0]
            writes = agents.writes
    if not redraws or shown != HOSTS:
        raise RuntimeError(f"the Hosts view showed {shown} hosts of {HOSTS} ({len(redraws)} redraws)")
    p95 = percentile(hosts_latencies, 0.95) * 1000
    base_p95 = percentile(devices_latencies, 0.95) * 1000
    ratio = p95 / base_p95 if base_p95 > 0 else None
    return [
        Result(
            benchmark="hosts",
            figure=f"key → new screen's frame, p95 of {len(hosts_latencies)} presses (j/n), Hosts view, {HOSTS} agents",
            value=p95,
            unit="ms",
            baseline_name=f"p95 of {len(devices_latencies)} presses (j/d), Devices, no agents, alternated",
            baseline=base_p95,
            ratio=ratio,
            target=f"ratio ≤ {TARGET_RATIO:g}",
            met=ratio is not None and ratio <= TARGET_RATIO,
            samples={"hosts_seconds": hosts_latencies, "devices_seconds": devices_latencies, "agent_writes": writes},
            notes=f"medians {median(hosts_latencies) * 1000:.1f} / {median(devices_latencies) * 1000:.1f} ms; "
            f"{writes} host.json + sample writes into the GCS emulator meanwhile (in this process)",
        ),
        Result(
            benchmark="hosts",
            figure=f"Hosts redraw of {HOSTS} hosts on the UI thread, p95 of {len(redraws)} reads",
            value=percentile(redraws, 0.95) * 1000,
            unit="ms",
            samples={"redraw_seconds": redraws},
            notes=f"p50 {median(redraws) * 1000:.1f} ms, max {max(redraws) * 1000:.1f} ms (the first builds the table)",
        ),
        Result(
            benchmark="hosts",
            figure=f"read of {HOSTS} host.json off the UI thread (GCS emulator), median of {len(reads)}",
            value=median(reads) * 1000,
            unit="ms",
            samples={"read_seconds": reads},
            notes=f"p95 {percentile(reads, 0.95) * 1000:.0f} ms; one listing, one concurrent batch",
        ),
    ]
