"""The command line shows a training cluster: its workers in ``watch`` and ``runs``, its cluster and pod in ``devices``.

A crafted run of three workers (worker 1 takes twice as long a step as the
others, worker 2 stopped beating a minute ago) is watched with ``tpudash
watch`` and listed with ``tpudash runs``; ``devices`` prints the description
of a MultiWorkerMirroredStrategy worker and of a TPU pod in its own words.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable

from rich.console import Console

from jobs.events import Metric, Progress, RunFinished, RunStarted
from tpudash.accel.description import LogicalDeviceInfo, RuntimeDescription
from tpudash.cli import main as cli
from tpudash.cli.render import render_devices, render_runs
from tpudash.cli.sinks import ConsoleSink
from tpudash.runs.backends import LocalRunFiles
from tpudash.runs.follow import WORKERS_READ_SECONDS, WorkersWatch
from tpudash.runs.layout import new_run_id
from tpudash.runs.recorder import RunRecorder
from tpudash.runs.store import RunStore
from tpudash.runs.workers import WorkerIdentity, read_workers

CHIEF = WorkerIdentity(index=0, count=3, task="chief", host="10.0.0.1:2222")
# (seconds since its heartbeat, seconds per step) of workers 0, 1 and 2.
WORKER_BEATS = [(1.0, 0.100), (2.0, 0.200), (60.0, 0.100)]


def craft_workers(run_dir, beats=WORKER_BEATS, done=(120, 100, 80)) -> None:
    """Three workers' heartbeats, as each worker of a cluster writes its own (see tpudash.runs.workers)."""
    writers = run_dir / "writers"
    for old in writers.glob("*.json"):
        old.unlink()  # the chief's own beat: the crafted ones stand for every worker
    writers.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for index, (age, step_seconds) in enumerate(beats):
        payload = {
            "heartbeat": now - age, "interval": 5.0, "pid": 100 + index, "host": f"10.0.0.{index + 1}:2222",
            "writer": f"tpu-vm-{index}-1", "worker": index, "workers": 3,
            "task": "chief" if index == 0 else "worker", "step": done[index], "step_seconds": step_seconds,
            "progress": {"done": done[index], "total": 300, "unit": "step"}, "status": "running",
        }  # fmt: skip
        (writers / f"tpu-vm-{index}-1.json").write_text(json.dumps(payload))


def cluster_run(store: RunStore) -> tuple[str, RunRecorder]:
    """A run its chief is writing, its three workers' heartbeats crafted (the chief's own beat stopped for them)."""
    run_id = new_run_id("train")
    recorder = store.create(run_id, "train", {}, {"kind": "CPU"}, worker=CHIEF)
    assert isinstance(recorder, RunRecorder)  # this disk's
    recorder.record(RunStarted(run_id, "train", {}, {"kind": "CPU"}, time.time()))
    recorder.record(Progress(120, 300, "step"))
    recorder.record(Metric("loss", 0.5, step=120))
    assert recorder.heartbeat is not None
    recorder.heartbeat.stop()
    craft_workers(store.local_dir(run_id))
    return run_id, recorder


def worker_lines(out: str) -> dict[str, str]:
    return {line.split()[1]: line for line in out.splitlines() if line.strip().startswith("worker ")}


def watch_until(argv: list[str], capsys, seen: Callable[[str], bool], recorder: RunRecorder) -> tuple[int, str]:
    """``tpudash watch`` on a thread until its output shows ``seen`` (within 10 s), then the run finishes."""
    codes: list[int] = []
    watching = threading.Thread(target=lambda: codes.append(cli.main(argv)), daemon=True)
    watching.start()
    out = ""
    deadline = time.monotonic() + 10
    try:
        while not seen(out):
            assert watching.is_alive(), f"watch ended early:\n{out}"
            assert time.monotonic() < deadline, f"not seen within 10 s:\n{out}"
            watching.join(0.02)
            out += capsys.readouterr().out
    finally:
        recorder.record(RunFinished(status="done"))
        recorder.close()
        watching.join(10)
    assert not watching.is_alive(), "watch did not end within 10 s of the run's finish"
    return codes[0], out + capsys.readouterr().out


def test_watch_prints_each_workers_line_with_the_straggler_and_the_stale_one_in_words(isolated_runs_dir, capsys):
    run_id, recorder = cluster_run(RunStore(isolated_runs_dir))

    code, out = watch_until(
        ["watch", run_id, "--telemetry-interval", "0"], capsys, lambda out: len(worker_lines(out)) == 3, recorder
    )
    assert code == 0, out
    heading = next(line for line in out.splitlines() if line.startswith("workers:"))
    assert "2 of 3 live" in heading and "straggler: worker 1" in heading and "stale: worker 2" in heading
    lines = worker_lines(out)
    assert "10.0.0.1:2222" in lines["0"] and "step 120/300" in lines["0"] and "100 ms/step" in lines["0"]
    assert lines["0"].rstrip().endswith("live") and "beat 00:01 ago" in lines["0"]
    assert "200 ms/step" in lines["1"] and lines["1"].rstrip().endswith("straggler")
    assert "01:00 ago" in lines["2"] and lines["2"].rstrip().endswith("stale")
    assert out.count("workers:") == 1  # nothing changed since: printed once


def test_watch_json_stays_the_runs_events(isolated_runs_dir, capsys):
    run_id, recorder = cluster_run(RunStore(isolated_runs_dir))

    code, out = watch_until(
        ["watch", run_id, "--json", "--telemetry-interval", "0"], capsys, lambda out: '"metric"' in out, recorder
    )
    assert code == 0
    events = [json.loads(line) for line in out.splitlines()]
    assert [event["type"] for event in events] == ["run_started", "progress", "metric", "run_finished"]


def test_a_workers_lines_print_again_only_when_what_they_say_changed(tmp_path):
    craft_workers(tmp_path)
    files = LocalRunFiles(tmp_path)
    output = io.StringIO()
    sink = ConsoleSink(Console(file=output, width=120))
    sink.show_workers(read_workers(files))
    first = output.getvalue()
    assert len(worker_lines(first)) == 3

    # The same progress a second later: the heartbeats are older, nothing else is; nothing printed.
    craft_workers(tmp_path, [(age + 1, seconds) for age, seconds in WORKER_BEATS])
    sink.show_workers(read_workers(files))
    assert output.getvalue() == first

    # Worker 1 caught up: printed again, and no one is a straggler any more.
    craft_workers(tmp_path, [(1.0, 0.1), (1.0, 0.1), (60.0, 0.1)], done=(140, 140, 80))
    sink.show_workers(read_workers(files))
    again = output.getvalue()[len(first) :]
    assert "step 140/300" in worker_lines(again)["1"] and "straggler" not in again


def test_the_workers_are_read_at_most_every_five_seconds():
    class Files:
        reads = 0

        def list_by_time(self, folder):
            Files.reads += 1
            return []

    now = [100.0]
    watch = WorkersWatch(Files(), local=True, clock=lambda: now[0])  # type: ignore[arg-type]
    assert watch.update() == [] and Files.reads == 1  # at once
    now[0] += WORKERS_READ_SECONDS - 0.1
    assert watch.update() is None and Files.reads == 1
    now[0] += 0.1
    assert watch.update() == [] and Files.reads == 2


def test_in_a_store_the_workers_are_read_on_a_thread_and_handed_on_at_a_later_look(tmp_path):
    craft_workers(tmp_path)
    watch = WorkersWatch(LocalRunFiles(tmp_path), local=False)
    assert watch.update() is None  # asked: the answer comes later, the events keep coming meanwhile
    deadline = time.monotonic() + 10
    statuses = None
    while statuses is None:
        assert time.monotonic() < deadline, "the read on its thread did not come back within 10 s"
        statuses = watch.update()
    assert [(status.index, status.straggler) for status in statuses] == [(0, False), (1, True), (2, False)]
    assert watch.update() is None  # the next read is WORKERS_READ_SECONDS away


def test_runs_shows_how_many_workers_wrote_a_run_and_no_such_column_without_any(isolated_runs_dir, capsys):
    store = RunStore(isolated_runs_dir)
    alone = new_run_id("matmul")
    store.create(alone, "matmul", {}, {"kind": "CPU"}).close()
    assert cli.main(["runs"]) == 0
    assert "workers" not in capsys.readouterr().out

    clustered, recorder = cluster_run(store)
    recorder.close()
    assert cli.main(["runs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["run", "name", "workers"]
    by_run = {line.split()[0]: line for line in lines[1:]}
    assert "3 workers" in by_run[clustered] and "3 workers" not in by_run[alone]

    # In a terminal, the table has the column too, and the run ids whole.
    output = io.StringIO()
    render_runs(store.list_runs(), isolated_runs_dir, Console(file=output, width=100, force_terminal=True))
    table = output.getvalue()
    assert "workers" in table and "3 workers" in table and clustered in table


def mwms_worker() -> RuntimeDescription:
    return RuntimeDescription(
        kind="CPU",
        strategy="MultiWorkerMirroredStrategy",
        num_replicas=2,
        devices=[LogicalDeviceInfo(0, "/job:worker/replica:0/task:0/device:CPU:0", "CPU", "worker", 0, 0)],
        cluster={
            "worker": 0,
            "workers": 2,
            "addresses": ["127.0.0.1:4100", "127.0.0.1:4101"],
            "lost_worker_deadline_seconds": 15,
            "heartbeat_timeout_seconds": 10,
        },  # fmt: skip
    )


def pod_client() -> RuntimeDescription:
    hosts = ["10.130.0.2:8470", "10.130.0.3:8470", "10.130.0.4:8470", "10.130.0.5:8470"]
    return RuntimeDescription(
        kind="TPU",
        strategy="TPUStrategy",
        num_replicas=16,
        devices=[LogicalDeviceInfo(0, "/job:worker/replica:0/task:0/device:TPU:0", "TPU", "worker", 0, 0)],
        tpu_address="my-v4-32",
        topology={
            "mesh_shape": [2, 2, 4, 1],
            "num_tasks": 4,
            "num_tpus_per_task": 4,
            "hosts": 4,
            "chips_per_host": 4,
            "cores_per_chip": 1,
            "host_addresses": hosts,
        },  # fmt: skip
    )


def devices_text(description: RuntimeDescription) -> str:
    output = io.StringIO()
    render_devices(description, Console(file=output, width=200))
    return output.getvalue()


def test_devices_says_which_worker_of_the_cluster_this_is_and_the_clusters_addresses():
    description = mwms_worker()
    text = devices_text(description)
    assert "MultiWorkerMirroredStrategy, worker 0 of 2 (chief) · 2 replicas in sync" in text
    assert f"cluster: {description.cluster_text()}" in text
    assert "127.0.0.1:4100 (this worker), 127.0.0.1:4101" in text
    assert "a lost worker fails the run within 15 s" in text
    assert "topology" not in text
    # --json is the description's fields, the cluster among them.
    assert json.loads(json.dumps(description.to_dict()))["cluster"]["workers"] == 2


def test_devices_shows_a_pods_topology_as_hosts_times_chips_and_its_hosts():
    text = devices_text(pod_client())
    assert "TPU topology: 4 hosts × 4 chips (16 chips, 1 core each), mesh [2, 2, 4, 1]" in text
    assert "TPU hosts: 10.130.0.2:8470, 10.130.0.3:8470, 10.130.0.4:8470, 10.130.0.5:8470" in text
    assert "TPU address: my-v4-32" in text
    assert "per task" not in text  # not the raw mesh/tasks/cores line
    assert "TPUStrategy · 16 replicas in sync" in text
