"""A JAX job of two processes (``jax.distributed`` on the CPU) records one run: process 0 owns run.json, 1 joins.

Two real processes of the JAX venv (tests/jax/jax_process.py) talk through
JAX's coordinator on a loopback port; every wait is bounded by the
subprocess timeout.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.events import Metric, ReplicaValues, RunFinished, RunStarted
from tpudash.runs.store import RunStore
from tpudash.runs.tail import read_events
from tpudash.runs.workers import read_workers

PROJECT = Path(__file__).resolve().parents[2]
PROCESS_TIMEOUT_SECONDS = 120


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_job(runs_dir: Path, *run_id: str, count: int = 2) -> list[dict]:
    """Start ``count`` processes of one JAX job; each one's JSON report, in process order."""
    port = free_port()
    # Two devices a process is enough here (the conftest's eight would only slow the start).
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.jax.jax_process", str(port), str(index), str(count), str(runs_dir), *run_id],
            cwd=PROJECT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(count)
    ]
    reports = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=PROCESS_TIMEOUT_SECONDS)
            assert process.returncode == 0, err[-3000:]
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return reports


def test_two_jax_processes_record_one_run_process_zero_writing_run_json(tmp_path):
    runs_dir = tmp_path / "runs"
    reports = run_job(runs_dir, "two-jax-processes")
    assert [(report["index"], report["count"]) for report in reports] == [(0, 2), (1, 2)]
    assert [report["run_id"] for report in reports] == ["two-jax-processes"] * 2

    store = RunStore(runs_dir)
    assert store.run_ids() == ["two-jax-processes"]
    info = store.info("two-jax-processes")
    assert (info.status, info.workers, info.params) == ("done", 2, {"processes": 2})
    assert info.final_metrics["loss"] == pytest.approx(1 / 3)  # process 0's own loss: run.json is its alone
    (chief,) = [event for _, event in store.load("two-jax-processes").events if isinstance(event, RunStarted)]
    assert chief.runtime["backend"] == "jax" and chief.runtime["process"] == {"index": 0, "count": 2}
    assert chief.runtime["device_count"] == 4 and chief.runtime["local_device_count"] == 2

    worker_events, problems = read_events(store.stream("two-jax-processes", "worker-1"))
    assert problems == [] and isinstance(worker_events[-1][1], RunFinished)
    losses = [event.value for _, event in worker_events if isinstance(event, Metric)]
    assert losses == pytest.approx([2.0, 1.5, 1 + 1 / 3])  # worker 1's loss, read off its training thread
    (replicas,) = [event for _, event in worker_events if isinstance(event, ReplicaValues)]
    assert replicas.values == [2.0, 3.0]  # the global array's shards on its two devices
    workers = read_workers(store.files("two-jax-processes"))
    assert [(worker.index, worker.task, worker.status) for worker in workers] == [
        (0, "process", "done"),
        (1, "process", "done"),
    ]


def test_without_a_run_id_every_process_is_told_to_share_one(tmp_path):
    reports = run_job(tmp_path / "runs")
    assert all("run_id: this process is process" in report["refused"] for report in reports)
    assert all("the same run_id= on every worker" in report["refused"] for report in reports)
