"""The Hosts view under 64 agents: key p95 and the redraw time, against the same dashboard on Devices with none.

64 simulated agents write into one bucket (the GCS emulator on 127.0.0.1,
as bench_bucket uses it): each replaces its ``hosts/<name>/host.json``
(``tpudash.runs.hosts.host_record``, 4 TPU chips) every
``HOST_INTERVAL_SECONDS``, at its own phase, and adds a sample segment
(``samples/bench-<seq>.jsonl``) with it. The agents AND the emulator run in
a child process (``tests.benchmarks.hosts_agents_process``): real agents
run on other hosts and a real bucket on Google's machines, so none of
their work is charged to the dashboard, whose process only reads the
store (through gcsfs, pointed at the child's emulator). The child's CPU is
reported beside the figures: on this 2-core machine it still competes for
the cores, as a busy neighbour would.

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

Figures: key p95 and median in A and B and their ratios; the Hosts redraw
time (the UI thread's ``_show_hosts`` after a read: cells, column fit, table
build or in-place updates, title, detail), split into the builds of the
table (the first read of a fresh screen, or a change of the columns) and
the in-place redraws, p50/p95/max each, with the parts of the slowest; and
the read time of the 64 host.json (off the UI thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.benchmarks.bench_key_latency import SCREEN_FOR_KEY, FrameClock
from tests.benchmarks.harness import Result, median, percentile, process_cpu_seconds

HOSTS = 64
APP_SIZE = (120, 40)
TARGET_RATIO = 1.5
TIMEOUT = 120.0
SCREEN_FOR_KEY = {**SCREEN_FOR_KEY, "n": "HostsScreen"}


class AgentsProcess:
    """``hosts_agents_process`` as a child: its store URL, and this process's gcsfs pointed at its emulator."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.store = ""
        self.writes = 0
        self.cpu_seconds: float | None = None
        self.wall_seconds = 0.0
        self._process: subprocess.Popen[str] | None = None
        self._started = 0.0
        self._patch: Any = None

    def __enter__(self) -> AgentsProcess:
        command = [sys.executable, "-m", "tests.benchmarks.hosts_agents_process", "--hosts", str(self.count)]
        self._process = process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2]
        )
        self._started = time.monotonic()
        first = read_line(process, TIMEOUT)
        if not first:
            self.__exit__()
            raise RuntimeError(f"the agents' process exited ({process.returncode}) before naming its store")
        hello = json.loads(first)
        self.store = hello["store"]
        self._patch = reader_settings(hello["environment"], hello["client_config"])
        self._patch.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        self.wall_seconds = time.monotonic() - self._started
        self.cpu_seconds = process_cpu_seconds(process.pid)
        try:
            assert process.stdin is not None
            process.stdin.close()  # the child's signal to stop
            last = read_line(process, TIMEOUT)
            if last:
                self.writes = json.loads(last).get("writes", 0)
            process.wait(TIMEOUT)
        except (subprocess.TimeoutExpired, ValueError, OSError):
            process.kill()
            process.wait(TIMEOUT)
        finally:
            if self._patch is not None:
                self._patch.__exit__(None, None, None)
                self._patch = None

    @property
    def cores(self) -> float | None:
        if self.cpu_seconds is None or self.wall_seconds <= 0:
            return None
        return self.cpu_seconds / self.wall_seconds


def read_line(process: subprocess.Popen[str], timeout: float) -> str:
    """One line of the child's stdout, waiting at most ``timeout`` s ("" if it ended or said nothing)."""
    lines: list[str] = []
    assert process.stdout is not None
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    return lines[0].strip() if lines else ""


@contextlib.contextmanager
def reader_settings(environment: dict[str, str], client_config: dict[str, Any]) -> Iterator[None]:
    """This process's gcsfs reaches the child's emulator (as bench_bucket.gcs_emulator, for another process's)."""
    import fsspec.config
    import pytest

    from tests.object_stores import clear_filesystem_caches, plain_gcsfs

    with pytest.MonkeyPatch.context() as patch:
        for name, value in environment.items():
            patch.setenv(name, value)
        patch.setitem(fsspec.config.conf, "gs", client_config)
        plain_gcsfs(patch)
        clear_filesystem_caches()
        try:
            yield
        finally:
            clear_filesystem_caches()


class RedrawParts:
    """Times ``HostsScreen._show_hosts`` and its parts on the UI thread, each call a build or an in-place redraw."""

    PARTS = ("cells", "table", "title", "detail")

    def __init__(self) -> None:
        self.builds: list[dict[str, float]] = []
        self.in_place: list[dict[str, float]] = []
        self._current: dict[str, float] | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[RedrawParts]:
        import pytest

        import screens.hosts as hosts_module

        screen_class = hosts_module.HostsScreen
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(hosts_module, "host_cells", self._timed("cells", hosts_module.host_cells))
            for name, part in (
                ("_rebuild", "table"),
                ("_update_in_place", "table"),
                ("_show_title", "title"),
                ("_show_detail", "detail"),
            ):
                patch.setattr(screen_class, name, self._timed(part, getattr(screen_class, name)))
            patch.setattr(screen_class, "_show_hosts", self._show_hosts(screen_class._show_hosts))
            yield self

    def _timed(self, part: str, function: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                if self._current is not None:
                    self._current[part] += time.perf_counter() - started

        return timed

    def _show_hosts(self, function: Any) -> Any:
        parts = self

        def show_hosts(screen: Any) -> None:
            if screen.read_at is None:
                return function(screen)
            parts._current = current = defaultdict(float)
            rebuilt = screen.rows_rebuilt
            started = time.perf_counter()
            try:
                function(screen)
            finally:
                current["total"] = time.perf_counter() - started
                parts._current = None
            (parts.builds if screen.rows_rebuilt != rebuilt else parts.in_place).append(dict(current))

        return show_hosts


class FullCollections:
    """The pauses of the garbage collector's full (generation 2) collections, by the setup being timed."""

    def __init__(self) -> None:
        self.label: str | None = None
        self.pauses: dict[str, list[float]] = defaultdict(list)
        self._started = 0.0

    @contextlib.contextmanager
    def installed(self) -> Iterator[FullCollections]:
        gc.callbacks.append(self._callback)
        try:
            yield self
        finally:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif info["generation"] == 2 and self.label is not None:
            self.pauses[self.label].append(time.perf_counter() - self._started)

    def summary(self, label: str) -> str:
        pauses = self.pauses.get(label, [])
        if not pauses:
            return "no full collection"
        return f"{len(pauses)} full collections, {median(pauses) * 1000:.0f} ms median, {max(pauses) * 1000:.0f} max"


FULL_COLLECTIONS = FullCollections()


def spread(samples: list[dict[str, float]]) -> str:
    """``p50 a / p95 b / max c ms (n)``, and the parts of the slowest."""
    if not samples:
        return "none"
    totals = [sample["total"] * 1000 for sample in samples]
    slowest = max(samples, key=lambda sample: sample["total"])
    named = {part: slowest.get(part, 0.0) for part in RedrawParts.PARTS}
    named["fit"] = slowest["total"] - sum(named.values())  # widths, the columns' fit, the cut cells
    parts = ", ".join(f"{part} {seconds * 1000:.1f}" for part, seconds in named.items())
    return (
        f"p50 {median(totals):.1f} / p95 {percentile(totals, 0.95):.1f} / max {max(totals):.1f} ms "
        f"of {len(samples)} (slowest: {parts} ms)"
    )


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
        freeze_after_start=True,  # as the dashboard's own process runs it (tpudash.tui.app.run_app)
    )


async def presses(runs_dir: Path | str, home: str, count: int) -> tuple[list[float], list[float], int]:
    """A fresh app on ``home`` (after a warm-up visit of every key): ``count`` timed presses of j and ``home``.

    Returns the latencies, the Hosts screen's redraw times, and how many hosts it last showed.
    The previous app's garbage is collected first: a dashboard's process holds one app, and a full
    collection's pause grows with what it has to walk. The presses start once the app has settled in
    (every screen built ahead, and what it holds frozen out of the collector's way, as a dashboard does).
    """
    gc.collect()
    app = make_app(runs_dir)
    latencies: list[float] = []
    async with app.run_test(size=APP_SIZE) as pilot:
        await asyncio.wait_for(app.runtime_settled.wait(), TIMEOUT)
        clock = FrameClock(app)
        for key in ("j", home, "j", home):  # the warm-up: each screen built and shown once
            await pilot.press(key)
            await app.workers.wait_for_complete()
            await app.next_tick()
        await asyncio.wait_for(app.settled_in.wait(), TIMEOUT)
        FULL_COLLECTIONS.label = setup_label(home)
        for index in range(count):
            key = "j" if index % 2 == 0 else home
            awaited = SCREEN_FOR_KEY[key]
            if type(app.screen).__name__ == awaited:
                continue
            latencies.append(await asyncio.wait_for(press(clock, key, awaited), TIMEOUT))
            await app.next_tick()
            await app.next_tick()
        FULL_COLLECTIONS.label = None
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


def setup_label(home: str) -> str:
    return "Hosts" if home == "n" else "Devices"


def key_row(figure: str, latencies: dict[str, list[float]], hosts: str, devices: str, target: bool) -> Result:
    """Key p95 of the ``hosts`` setup against the ``devices`` one (and their medians, their full collections)."""
    a, b = latencies[hosts], latencies[devices]
    p95, base_p95 = percentile(a, 0.95) * 1000, percentile(b, 0.95) * 1000
    a_median, b_median = median(a) * 1000, median(b) * 1000
    ratio = p95 / base_p95 if base_p95 > 0 else None
    return Result(
        benchmark="hosts",
        figure=figure.format(count=len(a)),
        value=p95,
        unit="ms",
        baseline_name=f"p95 of {len(b)} presses (j/d), {devices}, no agents, alternated",
        baseline=base_p95,
        ratio=ratio,
        target=f"ratio ≤ {TARGET_RATIO:g}" if target else "",
        met=(ratio is not None and ratio <= TARGET_RATIO) if target else None,
        samples={"hosts_seconds": a, "devices_seconds": b},
        notes=f"medians {a_median:.1f} / {b_median:.1f} ms (ratio {a_median / b_median:.2f}); max "
        f"{max(a) * 1000:.0f} / {max(b) * 1000:.0f} ms; during the presses {FULL_COLLECTIONS.summary(hosts)} / "
        f"{FULL_COLLECTIONS.summary(devices)}",
    )


def run(quick: bool) -> list[Result]:
    rounds, count = (1, 6) if quick else (3, 30)
    latencies: dict[str, list[float]] = defaultdict(list)
    redraws: list[float] = []
    shown = 0
    parts = RedrawParts()
    with AgentsProcess(HOSTS) as agents, parts.installed(), FULL_COLLECTIONS.installed():
        reads = read_seconds(agents.store, 3 if quick else 10)
        for _ in range(rounds):  # A B A B
            measured, drawn, shown = asyncio.run(presses(agents.store, "n", count))
            latencies[setup_label("n")] += measured
            redraws += drawn
            if shown != HOSTS:
                raise RuntimeError(f"the Hosts view showed {shown} hosts of {HOSTS} ({len(drawn)} redraws)")
            empty = Path(tempfile.mkdtemp(prefix="tpudash-bench-hosts-none-"))
            latencies[setup_label("d")] += asyncio.run(presses(empty, "d", count))[0]
    if not redraws:
        raise RuntimeError("the Hosts view never redrew after a read")
    agents_cores = "?" if agents.cores is None else f"{agents.cores:.2f}"
    redraw_totals = [sample["total"] for sample in parts.builds + parts.in_place]
    return [
        key_row(
            f"key → new screen's frame, p95 of {{count}} presses (j/n), Hosts view, {HOSTS} agents",
            latencies,
            "Hosts",
            "Devices",
            target=True,
        ),
        Result(
            benchmark="hosts",
            figure=f"Hosts redraw of {HOSTS} hosts on the UI thread, p95 of {len(redraw_totals)} (builds and in place)",
            value=percentile(redraw_totals, 0.95) * 1000,
            unit="ms",
            samples={"redraw_seconds": redraws, "build_parts": parts.builds, "in_place_parts": parts.in_place},
            notes=f"table builds: {spread(parts.builds)}; in place: {spread(parts.in_place)}",
        ),
        Result(
            benchmark="hosts",
            figure=f"read of {HOSTS} host.json off the UI thread (GCS emulator), median of {len(reads)}",
            value=median(reads) * 1000,
            unit="ms",
            samples={"read_seconds": reads, "agent_writes": agents.writes, "agents_process_cores": agents.cores},
            notes=f"p95 {percentile(reads, 0.95) * 1000:.0f} ms; one listing, one concurrent batch; meanwhile the "
            f"agents' process (its own, with the emulator) made {agents.writes} host.json + sample writes "
            f"using {agents_cores} cores",
        ),
    ]
