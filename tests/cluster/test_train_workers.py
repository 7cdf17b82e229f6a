"""``tpudash run train --workers 2``: two TensorFlow workers on loopback ports, one run; and a worker killed mid-run.

Each test starts the real command line as a user does; the launcher starts
two ``tpudash run … --worker-index I --cluster …`` processes under it. Two
TensorFlow processes at once, at most (CI's 2 cores).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from jobs.events import Metric
from tpudash.engine.cluster import free_loopback_ports, tf_config
from tpudash.runs.store import RunStore
from tpudash.runs.workers import read_workers, worker_stream

REPO_ROOT = Path(__file__).resolve().parents[2]
USER_UNSET = ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_LOAD_LIBRARY", "TPU_SKIP_MDS_QUERY", "TF_CONFIG")
RUN_SECONDS = 150.0
"""The longest a 2-worker run of a few hundred synthetic examples may take on a loaded 2-core machine."""
LOST_WORKER_SECONDS = 5.0
"""The stated bound: a kill -9 of a worker ends the run as failed, naming it, within this (measured: well under 1 s)."""
pytest_plugins = ["tests.object_stores"]  # gcs_store: the loopback GCS emulator
TRAIN = ["run", "train", "--workers", "2", "--set", "source=synthetic", "--set", "model=light"]


def environment(runs_dir: Path | str, tmp_path: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in USER_UNSET}
    env.update(
        TPUDASH_RUNS_DIR=str(runs_dir),
        TPUDASH_TPU="none",
        TPUDASH_ENGINE_LOCK=str(tmp_path / "engine.lock"),
        XDG_DATA_HOME=str(tmp_path / "xdg"),
        XDG_CACHE_HOME=str(tmp_path / "xdg-cache"),
    )
    return env


def heartbeats(store: RunStore, run_id: str) -> dict[int, dict]:
    """The workers' heartbeats (``writers/*.json``) by worker index."""
    beats = {}
    for path in (store.local_dir(run_id) / "writers").glob("*.json"):
        try:
            beat = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced this instant
        if isinstance(beat.get("worker"), int):
            beats[beat["worker"]] = beat
    return beats


def test_train_on_two_workers_is_one_run_with_both_workers_and_rising_accuracy(tmp_path):
    runs_dir = tmp_path / "runs"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "tpudash", *TRAIN, "--set", "epochs=3", "--set", "limit_train=2048", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=environment(runs_dir, tmp_path),
        timeout=RUN_SECONDS,
    )
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    store = RunStore(runs_dir)
    (info,) = store.list_runs()
    run_json = json.loads((runs_dir / info.run_id / "run.json").read_text())
    assert run_json["workers"]["count"] == 2 and run_json["status"] == "done"
    # The chief's events are the run's, as `tpudash run train` prints them.
    printed = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert printed[0]["type"] == "run_started" and printed[-1]["type"] == "run_finished"
    accuracy = [
        event.value
        for _, event in store.stream(info.run_id).read_new(final=True)
        if isinstance(event, Metric) and event.name == "accuracy" and event.split == "train"
    ]
    assert accuracy and accuracy[-1] > 0.2, accuracy  # ten classes: chance is 0.1
    # Every replica of the cluster is validated per replica, not the chief's alone (issue 38).
    per_replica = [event for event in printed if event["type"] == "replica_values"]
    assert per_replica and {event["name"] for event in per_replica} == {
        "val loss per replica",
        "val accuracy per replica",
    }
    for event in per_replica:
        assert event["devices"] == [f"/job:worker/replica:0/task:{task}/device:CPU:0" for task in (0, 1)], event
        assert len(event["values"]) == 2
    # loop left at its default (auto): the custom loop trains without a warning about a fit nobody asked for.
    assert not [event for event in printed if event["type"] == "log" and event["text"].startswith("loop=fit asked")]
    assert printed[-1]["summary"]["loop"] == "custom"
    assert store.stream(info.run_id, worker_stream(1)).read_new(final=True), "worker 1 wrote no events of its own"
    assert set(heartbeats(store, info.run_id)) == {0, 1}
    for index in (0, 1):
        assert (store.local_dir(info.run_id) / f"worker-{index}.log").exists()
    print(f"\n2 workers: {took:.1f} s wall, final train accuracy {accuracy[-1]:.3f}")
    for index, beat in sorted(heartbeats(store, info.run_id).items()):
        print(f"worker {index}: step {beat.get('step')} at {beat.get('step_seconds')} s/step")


def worker_index(process: psutil.Process) -> int:
    """The ``--worker-index`` a launched worker was started with."""
    arguments = process.cmdline()
    return int(arguments[arguments.index("--worker-index") + 1])


def test_a_worker_killed_mid_run_ends_the_run_failed_naming_it_and_the_chief_exits(tmp_path):
    runs_dir = tmp_path / "runs"
    store = RunStore(runs_dir)
    tpudash = subprocess.Popen(
        [sys.executable, "-m", "tpudash", *TRAIN, "--set", "epochs=50", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env=environment(runs_dir, tmp_path),
    )
    try:
        # The launcher relays the chief's events as they happen: training has started on both workers once a
        # step is done (a collective step needs every worker).
        assert tpudash.stdout is not None
        run_id = None
        for line in tpudash.stdout:
            event = json.loads(line) if line.startswith("{") else {}
            run_id = run_id or event.get("run_id")
            if event.get("type") == "progress" and event.get("unit") == "step" and event.get("done", 0) > 0:
                break
        else:
            raise AssertionError("training never started on both workers")
        assert run_id is not None
        workers = {worker_index(child): child for child in psutil.Process(tpudash.pid).children()}
        chief, worker = workers[0], workers[1]
        killed_at = time.monotonic()
        worker.send_signal(signal.SIGKILL)
        _, stderr = tpudash.communicate(timeout=60)
        took = time.monotonic() - killed_at
        _, chief_alive = psutil.wait_procs([chief], timeout=10)
    finally:
        if tpudash.poll() is None:
            tpudash.kill()
            tpudash.wait(10)
    assert tpudash.returncode == 1, stderr[-3000:]
    info = store.info(run_id)
    assert info.status == "failed"
    assert "worker 1 (127.0.0.1:" in (info.error or "") and "killed by SIGKILL" in (info.error or "")
    assert took < LOST_WORKER_SECONDS, f"the run ended {took:.2f} s after the kill"
    assert not chief_alive, "the chief outlived the run"
    print(f"\nkill -9 of worker 1 to the run ended failed: {took:.2f} s")


def test_two_hosts_started_by_hand_one_with_flags_one_with_tf_config_agree_on_one_run(tmp_path):
    """What a user runs on each host of a real cluster, without the launcher and without --run-id."""
    runs_dir = tmp_path / "runs"
    addresses = [f"127.0.0.1:{port}" for port in free_loopback_ports(2)]
    common = ["run", "train", "--set", "source=synthetic", "--set", "epochs=1", "--set", "limit_train=512", "--json"]
    chief = subprocess.Popen(
        [sys.executable, "-m", "tpudash", *common, "--worker-index", "0", "--cluster", ",".join(addresses)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env=environment(runs_dir, tmp_path),
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "tpudash", *common],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env={**environment(runs_dir, tmp_path), "TF_CONFIG": tf_config(addresses, 1)},
    )
    try:
        _, chief_err = chief.communicate(timeout=RUN_SECONDS)
        _, worker_err = worker.communicate(timeout=RUN_SECONDS)
    finally:
        for process in (chief, worker):
            if process.poll() is None:
                process.kill()
                process.wait(10)
    assert (chief.returncode, worker.returncode) == (0, 0), (chief_err[-2000:], worker_err[-2000:])
    store = RunStore(runs_dir)
    (info,) = store.list_runs()  # one run: the worker took the chief's id
    assert info.status == "done" and info.workers == 2
    assert store.stream(info.run_id, worker_stream(1)).read_new(final=True), "worker 1 wrote into the chief's run"
    assert set(heartbeats(store, info.run_id)) == {0, 1}


def test_two_workers_write_one_run_into_a_bucket(gcs_store, tmp_path):
    """Each worker writes its own segments and heartbeat into the bucket; the chief, run.json and the events."""
    url = gcs_store.url("tpudash/runs")
    result = subprocess.run(
        [sys.executable, "-m", "tpudash", *TRAIN, "--set", "epochs=1", "--set", "limit_train=512", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**environment(url, tmp_path), **gcs_store.environment()},
        timeout=RUN_SECONDS,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    store = RunStore(url)
    (info,) = store.list_runs()
    assert (info.status, info.workers) == ("done", 2)
    assert store.stream(info.run_id, worker_stream(1)).read_new(final=True), "worker 1's segments are in the bucket"
    workers = read_workers(store.files(info.run_id))
    assert [(worker.index, worker.status) for worker in workers] == [(0, "done"), (1, "done")]
