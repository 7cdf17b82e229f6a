"""Workers of one run: which worker a process is, step times, stragglers, heartbeats read back, chief's liveness."""

from __future__ import annotations

import json
import os
import sys
import time
import types

import pytest

from jobs.events import Metric, Progress, RunFinished
from tpudash.runs.backends import LocalRunFiles
from tpudash.runs.liveness import store_writers_alive
from tpudash.runs.workers import (
    MAX_PROBLEMS_NAMED,
    MAX_WORKERS,
    StepTimer,
    WorkerIdentity,
    WorkerStatus,
    end_unended_workers,
    find_worker,
    mark_stragglers,
    read_workers,
)


def tf_config(task_type: str, index: int, chiefs: int = 1, workers: int = 2) -> dict[str, str]:
    cluster = {"worker": [f"127.0.0.1:{2000 + i}" for i in range(workers)]}
    if chiefs:
        cluster["chief"] = ["127.0.0.1:1999"]
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})}


# -- find_worker's order ----------------------------------------------------------------------------


def test_an_explicit_worker_comes_first_and_takes_the_clusters_count():
    found = find_worker(1, environ=tf_config("worker", 0))
    assert (found.index, found.count, found.task, found.is_chief) == (1, 3, "worker", False)
    given = WorkerIdentity(index=2, count=4, task="worker", host="h")
    assert find_worker(given, environ=tf_config("chief", 0)) is given
    assert find_worker(0, environ={}).is_chief


def test_tf_config_numbers_the_chief_first_and_its_workers_after_it():
    assert find_worker(environ=tf_config("chief", 0)) == WorkerIdentity(0, 3, "chief", "127.0.0.1:1999")
    assert find_worker(environ=tf_config("worker", 1)) == WorkerIdentity(2, 3, "worker", "127.0.0.1:2001")
    # Without a chief, worker 0 is the chief.
    without_chief = find_worker(environ=tf_config("worker", 0, chiefs=0))
    assert (without_chief.index, without_chief.count, without_chief.is_chief) == (0, 2, True)


def test_a_cluster_of_one_task_or_no_tf_config_is_one_process():
    assert find_worker(environ=tf_config("worker", 0, chiefs=0, workers=1)) is None
    assert find_worker(environ={}) is None
    assert find_worker(environ={"TF_CONFIG": "  "}) is None


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ("{not json", "TF_CONFIG: not JSON"),
        ('{"cluster": {"worker": "a:1"}, "task": {}}', "TF_CONFIG.cluster"),
        ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "ps", "index": 0}}', "TF_CONFIG.task.type"),
        ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 5}}', "TF_CONFIG.task.index"),
        ('{"cluster": {"worker": ["a:1", "b:2"]}}', "TF_CONFIG.task"),
    ],
)
def test_a_malformed_tf_config_is_an_error_naming_its_field(config, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        find_worker(environ={"TF_CONFIG": config})


class FakeResolver:
    task_type, task_id = "worker", 1

    def cluster_spec(self):
        return types.SimpleNamespace(as_dict=lambda: {"worker": ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"]})


class TPUClusterResolver(FakeResolver):
    pass


def test_a_strategys_cluster_resolver_tells_the_worker_but_a_tpu_pods_is_one_client():
    strategy = types.SimpleNamespace(cluster_resolver=FakeResolver())
    assert find_worker(strategy=strategy, environ={}) == WorkerIdentity(1, 3, "worker", "10.0.0.2:1")
    assert find_worker(strategy=types.SimpleNamespace(cluster_resolver=TPUClusterResolver()), environ={}) is None
    # TF_CONFIG comes before the strategy.
    assert find_worker(strategy=strategy, environ=tf_config("chief", 0)).task == "chief"


def test_jax_is_asked_only_when_already_loaded(monkeypatch):
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    assert find_worker(environ={}) is None
    fake_jax = types.SimpleNamespace(process_index=lambda: 3, process_count=lambda: 4)
    monkeypatch.setitem(sys.modules, "jax", fake_jax)
    found = find_worker(environ={})
    assert (found.index, found.count, found.task) == (3, 4, "process")


# -- step times and stragglers --------------------------------------------------------------------


def test_the_step_timer_takes_the_median_per_step_time_and_restarts_at_a_new_epoch():
    timer = StepTimer()
    for step, stamp in [(1, 10.0), (2, 10.5), (4, 11.5), (5, 15.0), (6, 15.5)]:  # one 3.5 s hiccup
        timer.observe(Metric(name="batch_loss", value=1.0, step=step), stamp)
        timer.observe(Metric(name="batch_accuracy", value=1.0, step=step), stamp + 0.01)  # the same step again
    assert timer.step_seconds == pytest.approx(0.5)
    timer.observe(Progress(done=100, total=100, unit="step"), 20.0)
    timer.observe(Progress(done=1, total=100, unit="step"), 21.0)  # the next epoch counts from 1 again
    timer.observe(Progress(done=2, total=100, unit="step"), 21.5)
    assert timer.progress == {"done": 2, "total": 100, "unit": "step"}
    assert timer.step == 6  # the metrics' steps are the run's


def status(index: int, seconds: float | None, *, alive: bool = True, state: str | None = "running") -> WorkerStatus:
    return WorkerStatus(
        index=index, task="worker", host="h", writer=f"w{index}", heartbeat=0.0, age=1.0, alive=alive,
        step_seconds=seconds, status=state,
    )  # fmt: skip


def test_a_worker_more_than_the_margin_over_the_median_is_a_straggler_and_a_stale_one_never_counts():
    marked = mark_stragglers([status(0, 1.0), status(1, 1.1), status(2, 1.4), status(3, 9.0, alive=False)])
    assert [worker.straggler for worker in marked] == [False, False, True, False]
    assert not any(worker.straggler for worker in mark_stragglers([status(0, 1.0), status(1, None)]))


# -- heartbeats read back -------------------------------------------------------------------------


def write_beat(run_dir, name: str, payload: dict | bytes) -> None:
    (run_dir / "writers").mkdir(parents=True, exist_ok=True)
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    (run_dir / "writers" / name).write_bytes(data)


def beat(index: int, age: float, **more) -> dict:
    return {
        "heartbeat": time.time() - age, "interval": 5.0, "pid": 10 + index, "host": f"10.0.0.{index}:1",
        "writer": f"host-{index}", "worker": index, "workers": 3, "task": "chief" if index == 0 else "worker",
        "step": 100, "step_seconds": 0.1, "progress": {"done": 100, "total": 200, "unit": "step"}, **more,
    }  # fmt: skip


def test_read_workers_lists_each_worker_once_and_names_every_bad_heartbeat_it_skips(tmp_path):
    write_beat(tmp_path, "host-0.json", beat(0, 1))
    write_beat(tmp_path, "host-1-old.json", beat(1, 60, writer="host-1-old"))  # the same worker before a restart
    write_beat(tmp_path, "host-1.json", beat(1, 2, step_seconds=0.2))
    write_beat(tmp_path, "host-2.json", beat(2, 40, step_seconds=0.1))  # stale
    write_beat(tmp_path, "alone.json", {"heartbeat": time.time(), "interval": 5, "writer": "alone"})  # no worker
    write_beat(tmp_path, "garbage.json", b"\x00not json")
    write_beat(tmp_path, "liar.json", beat(3, 1, step_seconds="fast"))
    write_beat(tmp_path, "huge.json", b" " * 10_000)
    problems: list[str] = []
    workers = read_workers(LocalRunFiles(tmp_path), problems=problems)
    assert [(w.index, w.alive, w.straggler, w.progress) for w in workers] == [
        (0, True, False, (100, 200, "step")),
        (1, True, True, (100, 200, "step")),
        (2, False, False, (100, 200, "step")),
    ]
    assert workers[1].writer == "host-1"
    assert sorted(problem.split(":")[0] for problem in problems) == [
        "writers/garbage.json",
        "writers/huge.json",
        "writers/liar.json",
    ]
    assert "step_seconds" in next(problem for problem in problems if "liar" in problem)


def test_a_worker_whose_heartbeat_is_from_the_future_is_not_live_and_is_named(tmp_path):
    write_beat(tmp_path, "host-0.json", beat(0, 1))
    write_beat(tmp_path, "host-1.json", beat(1, -3 * 3600))  # its clock 3 h ahead of ours
    write_beat(tmp_path, "host-2.json", beat(2, -2))  # within the clocks' skew
    problems: list[str] = []
    workers = read_workers(LocalRunFiles(tmp_path), problems=problems)
    assert [(w.index, w.alive) for w in workers] == [(0, True), (1, False), (2, True)]
    assert problems == ["writers/host-1.json: worker 1: its heartbeat is 3 h ahead of this clock (not counted as live)"]


def test_a_restarted_workers_heartbeat_from_the_future_never_outranks_its_latest(tmp_path):
    write_beat(tmp_path, "host-1-old.json", beat(1, -1e9, writer="host-1-old"))
    write_beat(tmp_path, "host-1.json", beat(1, 1))
    (worker,) = read_workers(LocalRunFiles(tmp_path))
    assert (worker.writer, worker.alive) == ("host-1", True)


def test_junk_past_the_first_few_is_counted_and_never_hides_a_worker_that_beats(tmp_path):
    for number in range(MAX_WORKERS):
        write_beat(tmp_path, f"a{number:03d}.json", b"junk")
        os.utime(tmp_path / "writers" / f"a{number:03d}.json", (time.time() - 60, time.time() - 60))
    write_beat(tmp_path, "host-0.json", beat(0, 1))
    problems: list[str] = []
    workers = read_workers(LocalRunFiles(tmp_path), problems=problems)
    assert [(w.index, w.alive) for w in workers] == [(0, True)]
    assert len(problems) == MAX_PROBLEMS_NAMED + 2
    assert all(problem.endswith(": not JSON") for problem in problems[:MAX_PROBLEMS_NAMED])
    assert problems[MAX_PROBLEMS_NAMED:] == [
        f"writers/: {MAX_WORKERS - 1 - MAX_PROBLEMS_NAMED} more files are no heartbeats; skipped",
        f"writers/: {MAX_WORKERS + 1} files; the newest {MAX_WORKERS} were read",
    ]


def test_a_runs_liveness_in_a_store_is_its_chiefs_alone(tmp_path):
    files = LocalRunFiles(tmp_path)
    write_beat(tmp_path, "host-1.json", beat(1, 1))
    assert store_writers_alive(files) is False  # another worker beats, the chief does not
    write_beat(tmp_path, "host-0.json", beat(0, 1))
    assert store_writers_alive(files) is True


# -- one run, two writers, through the store's recorders ------------------------------------------


def test_a_chief_and_a_worker_write_one_run_its_record_the_chiefs(tmp_path, monkeypatch):
    from tpudash.runs.segments import StreamTail
    from tpudash.runs.store import RunStore
    from tpudash.runs.tail import read_events

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    store = RunStore(tmp_path / "runs")
    store.prepare()
    worker = store.join("shared-run", "loop", {}, {}, worker=WorkerIdentity(1, 2, "worker", "b"))  # first
    chief = store.create("shared-run", "loop", {}, {}, worker=WorkerIdentity(0, 2, "chief", "a"))
    for step in range(4):
        chief.record(Metric(name="loss", value=1.0, step=step), 100.0 + step)
        worker.record(Metric(name="loss", value=2.0, step=step), 100.0 + 2 * step)
    worker.record(RunFinished(status="done", summary={}, error=None, traceback=None))
    chief.record(RunFinished(status="done", summary={}, error=None, traceback=None))
    info = store.info("shared-run")
    assert (info.status, info.workers, info.final_metrics) == ("done", 2, {"loss": 1.0})
    assert info.to_dict()["workers"] == 2
    events, problems = read_events(StreamTail(store.files("shared-run"), "worker-1"))
    assert problems == [] and [event.value for _, event in events if isinstance(event, Metric)] == [2.0] * 4
    workers = read_workers(store.files("shared-run"))
    assert [(w.index, w.status, w.step_seconds) for w in workers] == [(0, "done", 1.0), (1, "done", 2.0)]
    assert [w.straggler for w in workers] == [False, True]
    with pytest.raises(FileExistsError):
        store.create("shared-run", "loop", {}, {}, worker=WorkerIdentity(0, 2, "chief", "a"))


# -- a user's script started twice, chief and worker, on one run ------------------------------------

pytest_plugins = ["tests.object_stores"]  # gcs_store: a loopback GCS emulator


def check_one_run_of_two_workers(runs_dir: str, run_id: str) -> None:
    """One run: the chief's record and metrics are the run's, both workers listed, worker 1's stream its own."""
    from tpudash.runs.store import RunStore
    from tpudash.runs.tail import read_events

    store = RunStore(runs_dir)
    assert store.run_ids() == [run_id]
    info = store.info(run_id)
    assert (info.status, info.workers, info.source) == ("done", 2, "record")
    assert info.final_metrics["loss"] == pytest.approx(1 / 40)  # the chief's, not worker 1's (1 + 1/40)
    chief_events, _ = read_events(store.stream(run_id))
    worker_events, problems = read_events(store.stream(run_id, "worker-1"))
    assert problems == []
    assert [event.value for _, event in worker_events if isinstance(event, Metric)][-1] == pytest.approx(1 + 1 / 40)
    assert isinstance(worker_events[-1][1], RunFinished) and isinstance(chief_events[-1][1], RunFinished)
    workers = read_workers(store.files(run_id))
    assert [(w.index, w.task, w.status, w.progress) for w in workers] == [
        (0, "chief", "done", (40, 40, "step")),
        (1, "worker", "done", (40, 40, "step")),
    ]
    assert [w.straggler for w in workers] == [False, True]  # it paused three times as long per step


def test_a_loop_started_as_chief_and_as_worker_records_one_run_in_a_directory(tmp_path):
    import os

    from tests.cluster.user_script import run_two_workers

    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    run_two_workers(str(tmp_path / "runs"), "record", "loop-on-two-workers", env)
    check_one_run_of_two_workers(str(tmp_path / "runs"), "loop-on-two-workers")
    assert not list((tmp_path / "cache").rglob("*.jsonl"))  # nothing left unsent


def test_a_loop_started_as_chief_and_as_worker_records_one_run_in_a_bucket(gcs_store, tmp_path):
    import os

    from tests.cluster.user_script import run_two_workers

    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), **gcs_store.environment())
    run_two_workers(gcs_store.url("runs"), "record", "loop-on-two-workers", env)
    check_one_run_of_two_workers(gcs_store.url("runs"), "loop-on-two-workers")


def test_several_workers_without_a_shared_run_id_are_told_before_anything_is_written(tmp_path, monkeypatch):
    from tpudash.recording import RecordedRun, RecordingError

    monkeypatch.delenv("TPUDASH_RUN_ID", raising=False)
    monkeypatch.setenv("TF_CONFIG", tf_config("worker", 0)["TF_CONFIG"])
    with pytest.raises(RecordingError, match="run_id: this process is worker 1 of 3 workers"):
        RecordedRun("loop", runs_dir=tmp_path)
    assert not list(tmp_path.iterdir())


def test_a_cancelled_runs_workers_that_were_killed_before_their_last_beat_are_said_cancelled(tmp_path):
    """The launcher, once every worker is gone after a cancel: one that said how it ended keeps its word, one
    killed mid-collective (its last beat "running", now stale) is said cancelled, its last beat's time kept."""
    write_beat(tmp_path, "host-0.json", beat(0, 1, status="cancelled"))
    write_beat(tmp_path, "host-1.json", beat(1, 20, status="running"))
    write_beat(tmp_path, "host-2.json", beat(2, 20))  # an older worker: no status at all
    write_beat(tmp_path, "alone.json", {"heartbeat": time.time(), "interval": 5, "writer": "alone"})  # no worker
    files = LocalRunFiles(tmp_path)
    before = {worker.index: worker for worker in read_workers(files)}
    assert [before[index].status for index in (0, 1, 2)] == ["cancelled", "running", None]

    assert end_unended_workers(files, "cancelled") == [1, 2]

    after = {worker.index: worker for worker in read_workers(files)}
    assert [after[index].status for index in (0, 1, 2)] == ["cancelled"] * 3
    assert all(after[index].heartbeat == before[index].heartbeat for index in (1, 2))
    assert json.loads((tmp_path / "writers" / "alone.json").read_bytes())["writer"] == "alone"  # left alone
    assert end_unended_workers(files, "cancelled") == []  # nothing left to say
