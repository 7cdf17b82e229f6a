"""Target: ``tpudash agent``'s memory stays flat — under 256 KiB of growth over a day of samples after warm-up.

The agent (``tpudash.telemetry.agent.HostAgent``) runs for days on every
host. This drives its loop in this process, ``tick`` after ``tick`` with a
fake clock advanced by one interval per tick (5 s: a full run is 20 000
ticks, 28 hours of the agent's time, in seconds of this one), against a
``memory://`` store:

- the sampler is scripted (4 chips whose figures change every tick, the
  host's CPU and memory), so what is measured is the agent, not grpc;
- one run is live on this host the whole time (its writer beats in the
  store), so the live-runs scan (every ``RUNS_SCAN_SECONDS`` of the fake
  clock), the adoption and the run's telemetry writer are exercised, and the
  scan's run cache is renewed every ``STORE_RENEW_SECONDS``;
- a ``memory://`` store keeps what is written in this process: every
  ``DROP_EVERY`` ticks the writers' segments are closed and uploaded and the
  host's and the run's samples are dropped from the store (in a bucket they
  are the bucket's memory, not the agent's).

Measured: tracemalloc's current size and the process's resident memory
after a warm-up (the first tenth of the ticks, rounded to a drop) and at the end; the figure is
tracemalloc's growth. ``--quick``: 2 000 ticks.
"""

from __future__ import annotations

import gc
import socket
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path

import psutil

from jobs.events import Telemetry
from tests.benchmarks.harness import Result
from tpudash.runs.hosts import HOST_INTERVAL_SECONDS, host_prefix
from tpudash.runs.layout import TELEMETRY_STREAM
from tpudash.runs.store import RunStore
from tpudash.telemetry.agent import HostAgent, default_host_name

FULL_TICKS = 20_000
QUICK_TICKS = 2_000
DROP_EVERY = 500
TARGET_GROWTH_KIB = 256.0
GIB = 1 << 30


class FakeClock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class ScriptedSampler:
    """Four chips whose figures change every sample, and a host; no grpc, no psutil."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.count = 0

    def sample(self, processes: object = None) -> tuple[float, Telemetry]:
        self.count += 1
        chips = [
            {
                "chip": chip,
                "duty_cycle_pct": float((self.count + chip) % 100),
                "hbm_used": (self.count % 16) * GIB,
                "hbm_total": 16 * GIB,
            }
            for chip in range(4)
        ]
        host = {"cpu_pct": [float(self.count % 100)] * 8, "memory_used": 3 * GIB, "memory_total": 32 * GIB}
        return self.clock(), Telemetry(chips=chips, host=host, unavailable={})

    def close(self) -> None:
        pass


def drop_stored_samples(agent: HostAgent, runs_url: str, run_id: str) -> None:
    """What the store keeps is the store's: in a bucket it is not in the agent's memory.

    Every segment is closed and uploaded first, so each measurement finds the writers empty alike.
    """
    for writer in (agent.samples, *(samples.writer for samples in agent.store_runs.values())):
        writer.wait_uploaded(10.0)
    filesystem, root = agent.root.filesystem, runs_url.removeprefix("memory://")  # type: ignore[union-attr]
    for prefix in (f"/{root}/{host_prefix(agent.name)}/samples", f"/{root}/{run_id}/{TELEMETRY_STREAM}"):
        if filesystem.exists(prefix):
            filesystem.rm(prefix, recursive=True)


def run(quick: bool) -> list[Result]:
    ticks = QUICK_TICKS if quick else FULL_TICKS
    runs_url = f"memory://bench-agent-{uuid.uuid4().hex[:8]}/runs"
    spill = Path(tempfile.mkdtemp(prefix="tpudash-bench-agent-"))
    store = RunStore(runs_url, spill_root=spill)
    run_id = "20261121-025100-train-1a2b3c"
    recorder = store.create(run_id, "train", {}, {})  # live on this host, beating, for the whole benchmark
    clock = FakeClock()
    hostname = socket.gethostname()
    agent = HostAgent(
        runs_url,
        default_host_name(hostname),
        ScriptedSampler(clock),
        interval=HOST_INTERVAL_SECONDS,
        hostname=hostname,
        spill_root=spill,
        clock=clock,
        notify=lambda line: None,
    )
    process = psutil.Process()
    # At a drop, so both measurements find the writers alike: each uploader still holds its last segment.
    warm_up = DROP_EVERY * max(1, ticks // 10 // DROP_EVERY) - 1
    tracemalloc.start()
    started = time.perf_counter()
    try:
        for tick in range(ticks):
            clock.now += HOST_INTERVAL_SECONDS
            agent.tick()
            if tick % DROP_EVERY == DROP_EVERY - 1:
                drop_stored_samples(agent, runs_url, run_id)
            if tick == warm_up:
                gc.collect()  # what the agent keeps, not garbage the collector has yet to visit
                base_traced, _ = tracemalloc.get_traced_memory()
                base_rss = process.memory_info().rss
        drop_stored_samples(agent, runs_url, run_id)
        gc.collect()  # what the agent keeps, not garbage the collector has yet to visit
        end_traced, peak_traced = tracemalloc.get_traced_memory()
        end_rss = process.memory_info().rss
        adopted = run_id in agent.store_runs
    finally:
        tracemalloc.stop()
        seconds = time.perf_counter() - started
        agent.close(timeout=5.0)
        recorder.close()
    growth_kib = (end_traced - base_traced) / 1024
    recorded = run_id in agent.live_runs
    return [
        Result(
            benchmark="agent",
            figure=f"agent memory growth over {ticks - warm_up} ticks (traced)",
            value=round(growth_kib, 1),
            unit="KiB",
            target=f"< {TARGET_GROWTH_KIB:g} KiB",
            met=growth_kib < TARGET_GROWTH_KIB,
            samples={"rss_growth_kib": round((end_rss - base_rss) / 1024, 1), "peak_traced_kib": peak_traced // 1024},
            notes=(
                f"{ticks} ticks of {HOST_INTERVAL_SECONDS:g} s ({ticks * HOST_INTERVAL_SECONDS / 3600:.1f} h of agent "
                f"time) in {seconds:.1f} s; RSS grew {(end_rss - base_rss) / 1024:.0f} KiB; the live run on this host "
                f"{'was' if recorded else 'was NOT'} found; its telemetry "
                f"{'was' if adopted else 'was not'} recorded by the agent"
            ),
        )
    ]


if __name__ == "__main__":
    for result in run(quick=False):
        print(result)
