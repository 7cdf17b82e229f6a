"""Two TensorFlow workers started directly with TF_CONFIG (no launcher): the train job under MultiWorkerMirroredStrategy.

Each worker is ``tests.cluster.mwms_train_worker``: the runtime detected from
its TF_CONFIG, then the train job's code on a synthetic set. Two TensorFlow
processes at once, at most (CI's 2 cores); every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tpudash.accel.multiworker import LOST_WORKER_DEADLINE_SECONDS, SHUTDOWN_BARRIER_TIMEOUT_SECONDS

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN_SECONDS = 240.0
"""The longest two workers may take to start and train a small synthetic set on a loaded 2-core machine."""
TRAIN = ["source=synthetic", "model=light", "limit_train=2048", "limit_test=512", "workers=2", "loop=fit"]
USER_UNSET = ("TPU_NAME", "COLAB_TPU_ADDR", "TF_CONFIG")


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def start_workers(out_dir: Path, params: list[str], watched: int | None = None) -> list[subprocess.Popen]:
    """Both workers; the ``watched`` one's events come through its stdout (a pipe) for the test to wait on."""
    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    workers = []
    for index in range(2):
        env = {key: value for key, value in os.environ.items() if key not in USER_UNSET}
        env["TF_CONFIG"] = json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})
        log = (out_dir / f"stderr-{index}.log").open("w")
        workers.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.cluster.mwms_train_worker", str(out_dir), *params],
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.PIPE if index == watched else log,
                stderr=log,
                text=True,
            )
        )
    return workers


def stop(workers: list[subprocess.Popen]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)


def outcome(out_dir: Path, worker: int) -> dict:
    path = out_dir / f"outcome-{worker}.json"
    assert path.exists(), (out_dir / f"stderr-{worker}.log").read_text()[-3000:]
    return json.loads(path.read_text())


def events(out_dir: Path, worker: int) -> list[dict]:
    path = out_dir / f"events-{worker}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def epoch_losses(out_dir: Path, worker: int) -> list[tuple[str, int, float]]:
    return [
        (event["split"], event["epoch"], event["value"])
        for event in events(out_dir, worker)
        if event["type"] == "Metric" and event["name"] == "loss"
    ]


def test_two_workers_train_with_identical_losses_and_the_chiefs_run_id(tmp_path):
    workers = start_workers(tmp_path, [*TRAIN, "epochs=3"])
    try:
        for worker in workers:
            worker.wait(RUN_SECONDS)
    finally:
        stop(workers)
    chief, other = outcome(tmp_path, 0), outcome(tmp_path, 1)
    assert (chief["status"], other["status"]) == ("done", "done"), (chief.get("error"), other.get("error"))
    # Every worker reports the same epoch losses: they are all-reduced over the cluster.
    assert epoch_losses(tmp_path, 0) == epoch_losses(tmp_path, 1)
    assert len(epoch_losses(tmp_path, 0)) == 3 * 2 + 1  # train and val per epoch, then test
    assert chief["summary"]["test_accuracy"] > 0.5  # ten classes: chance is 0.1
    assert chief["summary"]["replicas"] == 2 and chief["summary"]["loop"] == "custom"
    assert chief["agreed_run_id"] == other["agreed_run_id"] == "run-proposed-by-worker-0"
    logs = [event["text"] for event in events(tmp_path, 1) if event["type"] == "Log"]
    assert any("keras-team/keras#20585" in text for text in logs)
    assert chief["description"]["strategy"] == "MultiWorkerMirroredStrategy"
    # Only the chief writes TensorBoard scalars.
    assert chief["summary"]["tensorboard"] and other["summary"]["tensorboard"] is None
    assert not (tmp_path / "run-1" / "tensorboard").exists()
    print(
        f"\n2 workers: test accuracy {chief['summary']['test_accuracy']:.3f}, job "
        f"{chief['ended'] - chief['started']:.1f} s / {other['ended'] - other['started']:.1f} s, "
        f"{chief['summary']['examples_per_second']:.0f} examples/s"
    )


def test_a_killed_worker_fails_the_chief_within_the_stated_time_naming_it(tmp_path):
    workers = start_workers(tmp_path, [*TRAIN, "epochs=200"], watched=1)
    # Bounded: if training never gets there, the workers are stopped and worker 1's output ends.
    give_up = threading.Timer(RUN_SECONDS, stop, [workers])
    give_up.start()
    try:
        # Mid-run: worker 1 reports steps of its second epoch (its output ends early only if it does).
        assert workers[1].stdout is not None
        for line in workers[1].stdout:
            if json.loads(line).get("epoch") == 2:
                break
        else:
            raise AssertionError("worker 1 ended before its second epoch")
        assert workers[0].poll() is None, "the chief ended before the kill"
        killed_at = time.time()
        workers[1].send_signal(signal.SIGKILL)
        returncode = workers[0].wait(LOST_WORKER_DEADLINE_SECONDS + SHUTDOWN_BARRIER_TIMEOUT_SECONDS + 10)
        exited_after = time.time() - killed_at
    finally:
        give_up.cancel()
        stop(workers)
    chief = outcome(tmp_path, 0)
    failed_after = chief["ended"] - killed_at
    assert returncode == 1 and chief["status"] == "failed"
    assert chief["error_type"] == "WorkerLost"
    assert chief["error"].startswith("worker 1 (127.0.0.1:"), chief["error"]
    assert "was lost (this is worker 0 of 2): UnavailableError" in chief["error"]
    assert failed_after < LOST_WORKER_DEADLINE_SECONDS
    print(f"\nkill -9 of worker 1: the chief failed after {failed_after:.1f} s and exited after {exited_after:.1f} s")
