"""The multi-worker launcher without TensorFlow: flags, TF_CONFIG, ports, and workers lost, cancelled or done.

The workers here are ``tests.fake_cluster_worker`` (the command line a real
worker gets, a run written as the chief writes it), so these stay cheap;
tests/cluster runs the real ``tpudash run train --workers 2``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jobs.events import RunStarted
from tpudash.cli import main as cli
from tpudash.engine.cluster import (
    ClusterFlagError,
    ClusterLaunch,
    cluster_addresses,
    free_loopback_ports,
    tf_config,
    worker_count,
)
from tpudash.runs.store import RunStore

WAIT_SECONDS = 20.0


# -- flags and TF_CONFIG ---------------------------------------------------------------------------------
def test_tf_config_names_every_worker_and_this_ones_index():
    config = json.loads(tf_config(["127.0.0.1:2000", "127.0.0.1:2001"], 1))
    assert config == {
        "cluster": {"worker": ["127.0.0.1:2000", "127.0.0.1:2001"]},
        "task": {"type": "worker", "index": 1},
    }


def test_cluster_addresses_reads_host_port_pairs():
    assert cluster_addresses("10.0.0.2:2222, 10.0.0.3:2222") == ["10.0.0.2:2222", "10.0.0.3:2222"]


@pytest.mark.parametrize("text", ["", "10.0.0.2", "10.0.0.2:", ":2222", "a:1,,b:2", "a:99999", "a:1,a:1", "a b:1"])
def test_a_cluster_that_cannot_be_used_is_named_with_the_allowed_form(text):
    with pytest.raises(ClusterFlagError, match="--cluster: .*allowed"):
        cluster_addresses(text)


@pytest.mark.parametrize("text", ["0", "65", "two", "-1"])
def test_workers_outside_1_to_64_are_refused_naming_the_flag(text):
    with pytest.raises(ClusterFlagError, match="--workers: .*allowed: 1 to 64"):
        worker_count(text)


def test_free_loopback_ports_are_distinct_and_bindable():
    import socket

    ports = free_loopback_ports(4)
    assert len(set(ports)) == 4
    for port in ports:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--worker-index", "1"], "--worker-index and --cluster go together"),
        (["--cluster", "127.0.0.1:1,127.0.0.1:2"], "--worker-index and --cluster go together"),
        (["--worker-index", "2", "--cluster", "127.0.0.1:1,127.0.0.1:2"], "--worker-index: .*allowed: 0 to 1"),
        (["--worker-index", "0", "--cluster", "nowhere"], "--cluster: .*host:port"),
        (["--workers", "100"], "--workers: .*1 to 64"),
        (["--workers", "2"], "--workers: job matmul runs in one process"),
        (["--run-id", "../elsewhere"], "--run-id: .*cannot name a run"),
    ],
)
def test_run_refuses_cluster_flags_it_cannot_use_naming_them(argv, says, isolated_runs_dir, capsys):
    assert cli.main(["run", "matmul", *argv]) == 2
    assert re.search(says, capsys.readouterr().err)


def test_a_malformed_exported_tf_config_is_refused_naming_it(isolated_runs_dir, monkeypatch, capsys):
    monkeypatch.setenv("TF_CONFIG", "{not json")
    assert cli.main(["run", "matmul"]) == 2
    assert "TF_CONFIG" in capsys.readouterr().err


# -- the launcher with fake workers ---------------------------------------------------------------------------
class RelayedEvents(list):
    """The chief's events as the launcher relays them; ``started`` is set by its RunStarted."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()

    def add(self, stamp: float | None, event: object) -> None:
        self.append(event)
        if isinstance(event, RunStarted):
            self.started.set()


def launch(tmp_path: Path, mode: str, monkeypatch) -> tuple[ClusterLaunch, RelayedEvents, RunStore]:
    monkeypatch.setenv("FAKE_CLUSTER_MODE", mode)
    store = RunStore(tmp_path / "runs")
    store.prepare()
    events = RelayedEvents()
    environment = dict(os.environ, TPUDASH_RUNS_DIR=str(store.root), FAKE_CLUSTER_MODE=mode)
    repo = str(Path(__file__).resolve().parents[2])
    environment["PYTHONPATH"] = repo + os.pathsep + environment.get("PYTHONPATH", "")
    return (
        ClusterLaunch(
            job="train",
            params={"epochs": "2"},
            run_id="20260101-000000-train-abcdef",
            count=2,
            store=store,
            environment=environment,
            on_event=events.add,
            grace=2.0,
            program=(sys.executable, "-m", "tests.fake_cluster_worker"),
        ),
        events,
        store,
    )


def run_in_thread(cluster: ClusterLaunch, cancel: threading.Event) -> tuple[threading.Thread, list]:
    outcomes: list = []
    thread = threading.Thread(target=lambda: outcomes.append(cluster.run(cancel)), daemon=True)
    thread.start()
    return thread, outcomes


def test_a_run_on_two_workers_ends_as_its_chief_says_and_keeps_their_logs(tmp_path, monkeypatch):
    cluster, events, store = launch(tmp_path, "done", monkeypatch)
    outcome = cluster.run(threading.Event())
    assert (outcome.status, outcome.summary) == ("done", {"steps": 3})
    assert isinstance(events[0], RunStarted)  # relayed to the caller; the end is the caller's to say
    assert store.info(cluster.run_id).status == "done"
    command = cluster.command(1)
    assert command[command.index("--worker-index") + 1] == "1"
    assert command[command.index("--cluster") + 1] == ",".join(cluster.addresses)
    assert ["--set", "epochs=2"] == command[-2:]
    for index in (0, 1):
        log = store.local_dir(cluster.run_id) / f"worker-{index}.log"
        assert f"worker {index} of" in log.read_text()


def test_a_worker_killed_mid_run_ends_it_failed_naming_that_worker_and_the_chief_goes_too(tmp_path, monkeypatch):
    cluster, events, store = launch(tmp_path, "wait", monkeypatch)
    thread, outcomes = run_in_thread(cluster, threading.Event())
    assert events.started.wait(WAIT_SECONDS), "the chief never started the run"
    killed_at = time.monotonic()
    os.kill(cluster.processes[1].pid, signal.SIGKILL)
    thread.join(WAIT_SECONDS)
    took = time.monotonic() - killed_at
    assert not thread.is_alive()
    (outcome,) = outcomes
    assert outcome.status == "failed" and outcome.lost_worker == 1
    assert f"worker 1 ({cluster.addresses[1]}) was lost: killed by SIGKILL" in outcome.error
    info = store.info(cluster.run_id)
    assert info.status == "failed" and "worker 1" in (info.error or "")
    assert all(process.poll() is not None for process in cluster.processes)
    assert took < 3.0, f"the run ended {took:.2f} s after the kill"


def test_a_worker_that_fails_is_named_with_its_last_stderr_lines(tmp_path, monkeypatch):
    cluster, events, store = launch(tmp_path, "fail", monkeypatch)
    outcome = cluster.run(threading.Event())
    assert outcome.status == "failed"
    assert "worker 1" in outcome.error and "exited with status 1" in outcome.error
    assert "collective ops failed on this worker" in outcome.error
    assert store.info(cluster.run_id).status == "failed"


def test_cancel_stops_every_worker_and_the_run_ends_cancelled(tmp_path, monkeypatch):
    cluster, events, store = launch(tmp_path, "wait", monkeypatch)
    cancel = threading.Event()
    thread, outcomes = run_in_thread(cluster, cancel)
    assert events.started.wait(WAIT_SECONDS), "the chief never started the run"
    cancel.set()
    thread.join(WAIT_SECONDS)
    assert not thread.is_alive()
    assert outcomes[0].status == "cancelled"
    assert store.info(cluster.run_id).status == "cancelled"
    assert all(process.poll() is not None for process in cluster.processes)


# -- the runner: a run asking for several workers is launched, its chief's events reach the sinks ------------
def test_the_runner_launches_a_run_on_workers_and_its_sinks_hear_it_as_any_run(tmp_path, monkeypatch):
    from jobs.base import JobSpec, Param
    from tpudash.engine.runner import Runner

    monkeypatch.setenv("FAKE_CLUSTER_MODE", "done")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    repo = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", repo + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def never_here(context, params):
        raise AssertionError("a launched run never runs in the launcher's process")

    spec = JobSpec("train", "Train", "stand-in", (Param("workers", "int", 1, minimum=1, maximum=64),), never_here)
    store = RunStore(tmp_path / "runs")
    store.prepare()
    heard: list = []

    def no_runtime():
        raise AssertionError("the launcher detects no runtime: its workers do")

    runner = Runner(no_runtime, store, sinks=[lambda run, event: heard.append(event.type)])
    runner.worker_program = (sys.executable, "-m", "tests.fake_cluster_worker")
    run = runner.run_now(spec, {"workers": 2})
    assert run.state == "done"
    assert heard[0] == "run_started" and heard[-1] == "run_finished" and heard.count("run_finished") == 1
    assert store.info(run.run_id).status == "done"


# -- a worker never outlives its launcher ------------------------------------------------------------------
# The launcher: starts a worker that shares its stdout, then waits. The worker ties itself to the launcher as
# `tpudash run --worker-index` does, says so, and blocks on nothing the launcher's death would end.
LAUNCHER_SCRIPT = """
import os, subprocess, sys
worker = (
    "from tpudash.engine.cluster import die_with_launcher; import os, threading; die_with_launcher(os.environ); "
    "print('tied', flush=True); threading.Event().wait()"
)
subprocess.Popen([sys.executable, "-c", worker], env=dict(os.environ, TPUDASH_LAUNCHER_PID=str(os.getpid())))
sys.stdin.read()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_launched_worker_dies_with_its_launcher_killed():
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert launcher.stdout is not None and launcher.stdout.readline().strip() == "tied"
    launcher.kill()
    # The worker holds the same stdout: it reaches its end only once the worker has died too.
    remaining, _ = launcher.communicate(timeout=WAIT_SECONDS)
    assert remaining == "" and launcher.returncode == -signal.SIGKILL
