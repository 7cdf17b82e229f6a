"""Three ``tpudash agent`` processes into one emulated bucket, as three TPU VMs of a slice would report.

Each agent reads its own fake libtpu metrics service (tests/fake_tpu_metrics.py)
on its own 127.0.0.1 port, as each VM's agent reads its own libtpu, and writes
into one bucket on the loopback GCS emulator (tests/object_stores.py). What a
user sees: ``tpudash hosts --json`` lists the three hosts live, each with its
own chips' figures; an agent killed with -9 turns stale within three of its
intervals (plus the reader's own lag); an agent sent SIGTERM exits 0 at once.

The store is looked at as any reader of a bucket looks at it (the writers are
other processes): a bounded loop with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.fake_tpu_metrics import GIB, FakeTpuMetrics
from tests.object_stores import StoreHandle
from tpudash.runs.hosts import STALE_AFTER_INTERVALS, HostsReader, HostStatus

# A whole-process end-to-end test: CI runs it after the default suite (pytest -m slow).
pytestmark = pytest.mark.slow

pytest_plugins = ["tests.object_stores"]  # gcs_store: a loopback GCS emulator

AGENTS = 3
INTERVAL = 0.5
# An agent's interpreter, imports and first report on a loaded 2-core machine.
FIRST_REPORT_SECONDS = 20.0
# How often this test looks at the bucket: a reader's poll, not a wait standing in for an event.
LOOK_EVERY = 0.1
# A SIGTERM'd agent closes its writers within agent.STOP_WAIT_SECONDS (5 s); the store here answers at once.
STOP_SECONDS = 6.0
Found = TypeVar("Found")


def look_until(what: str, find: Callable[[], Found | None], timeout: float) -> tuple[Found, float]:
    """Look at the store until ``find`` finds something (a bounded loop); what it found and when (monotonic)."""
    deadline = time.monotonic() + timeout
    while True:
        found = find()
        if found:
            return found, time.monotonic()
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not seen within {timeout:g} s")
        time.sleep(LOOK_EVERY)


@pytest.fixture
def metrics_services() -> Iterator[list[FakeTpuMetrics]]:
    """One fake libtpu per host, each with its own figures: host N's chips are busy 10·N+chip percent."""
    services = []
    try:
        for number in range(1, AGENTS + 1):
            service = FakeTpuMetrics(chips=4).start()
            service.set(
                duty={chip: 10.0 * number + chip for chip in range(4)},
                used={chip: number * GIB for chip in range(4)},
            )
            services.append(service)
        yield services
    finally:
        for service in services:
            service.stop()


def start_agent(name: str, metrics: FakeTpuMetrics, runs_url: str, log: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "tpudash", "agent", "--name", name, "--interval", str(INTERVAL)]
    argv += ["--runs-dir", runs_url, "--tpu-metrics", metrics.address]
    with log.open("w") as stderr:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr, cwd=log.parent, env=dict(os.environ))


def hosts_json(runs_url: str, cwd: Path) -> list[dict]:
    """``tpudash hosts --json``, as a user runs it."""
    argv = [sys.executable, "-m", "tpudash", "hosts", "--json", "--runs-dir", runs_url]
    listed = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=dict(os.environ), timeout=60)
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


def test_three_agents_report_into_one_bucket_a_killed_one_turns_stale_a_stopped_one_exits_0(
    gcs_store: StoreHandle, metrics_services: list[FakeTpuMetrics], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs_url = gcs_store.url("runs")
    names = [f"host{number}" for number in range(1, AGENTS + 1)]
    agents = {
        name: start_agent(name, service, runs_url, tmp_path / f"{name}.log")
        for name, service in zip(names, metrics_services)
    }
    try:
        reader = HostsReader(runs_url)

        def all_reporting_chips() -> list[HostStatus] | None:
            hosts = reader.read()
            return hosts if len(hosts) == AGENTS and all(len(host.chips) == 4 for host in hosts) else None

        look_until("three hosts with their chips", all_reporting_chips, FIRST_REPORT_SECONDS)

        listed = hosts_json(runs_url, tmp_path)
        assert [host["name"] for host in listed] == names
        assert not any(host["stale"] for host in listed)
        for number, host in enumerate(listed, start=1):
            assert [chip["duty_cycle"] for chip in host["chips"]] == [10.0 * number + chip for chip in range(4)]
            assert [chip["hbm_used"] for chip in host["chips"]] == [number * GIB] * 4
            assert host["interval"] == INTERVAL and host["problem"] is None
            assert host["memory_total"] > 0 and host["cpu_percent"] is not None

        killed = agents["host3"]
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=10)
        killed_at = time.monotonic()

        def host3_stale() -> bool:
            return any(host.name == "host3" and host.stale(time.time()) for host in reader.read())

        _, stale_at = look_until("host3 stale after kill -9", host3_stale, 10.0)
        # Its last report was at most one interval before the kill; stale after STALE_AFTER_INTERVALS more.
        assert stale_at - killed_at <= STALE_AFTER_INTERVALS * INTERVAL + 1.5
        listed = hosts_json(runs_url, tmp_path)
        assert [(host["name"], host["stale"]) for host in listed] == [
            ("host1", False),
            ("host2", False),
            ("host3", True),
        ]

        stopped = agents["host1"]
        asked_at = time.monotonic()
        stopped.send_signal(signal.SIGTERM)
        assert stopped.wait(timeout=STOP_SECONDS + 4) == 0, (tmp_path / "host1.log").read_text()
        assert time.monotonic() - asked_at <= STOP_SECONDS
        with capsys.disabled():  # the figures, for whoever runs this with -s
            print(
                f"\nkill -9 to stale: {stale_at - killed_at:.2f} s; SIGTERM to exit 0: {time.monotonic() - asked_at:.2f} s"
            )
    finally:
        for process in agents.values():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
