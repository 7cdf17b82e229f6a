"""Whether a run's writer is alive: its flock on this host (across namespaces and pid reuse), else its heartbeat.

The writers are real processes (``tests/writer_process.py``) killed with
SIGKILL; the tests wait on their pipes, never on a clock.
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
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO_ROOT
from tpudash.runs import liveness
from tpudash.runs.layout import new_run_id
from tpudash.runs.store import RunStore

WAIT = 60.0


class Writer:
    """``tests/writer_process.py`` in a child: a run recorded with ``tpudash.record`` until killed."""

    def __init__(self, runs_dir: Path):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.writer_process", "lively"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=dict(os.environ, TPUDASH_RUNS_DIR=str(runs_dir)),
        )
        started = self.process.stdout.readline().split()
        assert started[:1] == ["started"], started
        self.run_id = started[1]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=WAIT)

    def close(self) -> None:
        if self.process.poll() is None:
            self.kill()
        for stream in (self.process.stdin, self.process.stdout):
            stream.close()


def rewrite_run_json(run_dir: Path, **changes) -> None:
    meta = json.loads((run_dir / "run.json").read_text())
    meta.update(changes)
    (run_dir / "run.json").write_text(json.dumps(meta))


def test_a_live_writer_is_alive_and_once_killed_with_sigkill_its_run_is_interrupted(store):
    writer = Writer(store.root)
    try:
        info = store.info(store.find(writer.run_id))
        assert info.writer_alive() is True and (info.status, info.live) == ("running", True)
        writer.kill()
        info = store.info(store.find(writer.run_id))
        assert info.writer_alive() is False and (info.status, info.live) == ("interrupted", False)
    finally:
        writer.close()


def test_a_dead_writers_pid_given_to_an_unrelated_live_process_does_not_make_its_run_live(store):
    writer = Writer(store.root)
    try:
        writer.kill()
    finally:
        writer.close()
    run_dir = store.find(writer.run_id)
    # Pid reuse at its worst: the pid and its start time now name a live process (this one).
    rewrite_run_json(run_dir, pid=os.getpid(), pid_start_time=liveness.process_start_time(os.getpid()))
    info = store.info(run_dir)
    assert info.writer_alive() is False and info.status == "interrupted"


def test_a_writer_under_another_host_name_on_this_host_is_seen_alive_by_its_lock(store):
    """A container sharing the runs volume has its own host name and pid namespace, but the same kernel."""
    writer = Writer(store.root)
    try:
        run_dir = store.find(writer.run_id)
        rewrite_run_json(run_dir, host="a-container", pid=2**22 - 1, pid_start_time=1.0)
        info = store.info(run_dir)
        assert info.writer_alive() is True and (info.status, info.live) == ("running", True)
    finally:
        writer.close()


def make_foreign_run(store: RunStore, heartbeat_age: float) -> Path:
    """A running run written on another host, whose writer last beat ``heartbeat_age`` seconds ago."""
    run_id = new_run_id("remote")
    run_dir = store.root / run_id
    run_dir.mkdir(parents=True)
    meta = {"run_id": run_id, "job": "remote", "status": "running", "started": time.time() - 600, "host": "tpu-vm-7"}
    meta.update(pid=4242, pid_start_time=time.time() - 600)
    (run_dir / "run.json").write_text(json.dumps(meta))
    beat = {"heartbeat": time.time() - heartbeat_age, "interval": 5.0, "host": "tpu-vm-7", "pid": 4242}
    (run_dir / liveness.WRITER_FILE).write_text(json.dumps(beat))
    return run_dir


def test_a_run_of_another_host_is_live_while_its_heartbeat_is_fresh_and_interrupted_once_it_is_stale(store):
    fresh = store.info(make_foreign_run(store, heartbeat_age=1.0))
    assert fresh.writer_alive() is True and (fresh.status, fresh.live) == ("running", True)
    # Three intervals (15 s) without a beat: the writer is gone.
    stale = store.info(make_foreign_run(store, heartbeat_age=60.0))
    assert stale.writer_alive() is False and (stale.status, stale.live) == ("interrupted", False)


def test_the_writer_refreshes_its_heartbeat_on_schedule_and_stops_at_release(tmp_path):
    beats: list[float] = []
    third_beat = threading.Event()

    def clock() -> float:
        beats.append(1000.0 + len(beats))
        if len(beats) == 3:
            third_beat.set()
        return beats[-1]

    lock = liveness.WriterLock(tmp_path, interval=0.01, clock=clock).start()
    try:
        assert third_beat.wait(WAIT)
        assert liveness.lock_held(tmp_path) is True
    finally:
        lock.release()
    written = json.loads((tmp_path / liveness.WRITER_FILE).read_text())
    assert written["heartbeat"] == beats[-1] and written["interval"] == 0.01 and written["pid"] == os.getpid()
    assert liveness.lock_held(tmp_path) is False


def test_a_reader_never_creates_the_lock_file_and_a_fifo_in_its_place_neither_blocks_nor_counts(tmp_path):
    assert liveness.writer_alive(tmp_path, on_this_host=True) is None
    assert not (tmp_path / liveness.WRITER_FILE).exists()
    os.mkfifo(tmp_path / liveness.WRITER_FILE)
    assert liveness.writer_alive(tmp_path, on_this_host=False) is None


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20))
JSON_VALUES = st.recursive(
    JSON_SCALARS, lambda children: st.lists(children) | st.dictionaries(st.text(max_size=10), children), max_leaves=10
)
HEARTBEATS = st.fixed_dictionaries({"heartbeat": JSON_VALUES, "interval": JSON_VALUES})


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    content=st.one_of(
        st.binary(max_size=5000), st.builds(lambda value: json.dumps(value).encode(), JSON_VALUES | HEARTBEATS)
    )
)
def test_whatever_the_lock_file_holds_a_reader_answers_without_raising(tmp_path, content):
    (tmp_path / liveness.WRITER_FILE).write_bytes(content)
    assert liveness.heartbeat_fresh(tmp_path) in (True, False, None)
    assert liveness.writer_alive(tmp_path, on_this_host=False) in (True, False, None)


# -- each branch of the rule as liveness applies it (pinned for the mutation pass) -------------------------


def write_lock_beat(run_dir: Path, stamp: float, **more: object) -> None:
    (run_dir / liveness.WRITER_FILE).write_text(json.dumps({"heartbeat": stamp, **more}))


def test_a_lock_files_heartbeat_is_judged_at_its_boundaries_in_its_own_interval(tmp_path: Path) -> None:
    now = time.time()
    write_lock_beat(tmp_path, now - 15.0, interval=5.0)
    assert liveness.heartbeat_fresh(tmp_path, now) is True
    write_lock_beat(tmp_path, now - 15.01, interval=5.0)
    assert liveness.heartbeat_fresh(tmp_path, now) is False
    write_lock_beat(tmp_path, now - 25.0, interval=10.0)  # its own interval: live for 30 s
    assert liveness.heartbeat_fresh(tmp_path, now) is True
    write_lock_beat(tmp_path, now - 25.0, interval=10_000)  # no interval a writer may state: the default 5 s
    assert liveness.heartbeat_fresh(tmp_path, now) is False
    write_lock_beat(tmp_path, now - 1.0)  # none stated, judged at this moment
    assert liveness.heartbeat_fresh(tmp_path) is True
    assert liveness.beat_is_fresh(b"[]") is None and liveness.beat_state(b"{}") is None


def test_a_lock_files_heartbeat_from_the_future_is_not_live_and_says_so_once(tmp_path: Path) -> None:
    now = time.time()
    write_lock_beat(tmp_path, now + liveness.CLOCK_SKEW_SECONDS, interval=5.0)
    problems: list[str] = []
    assert liveness.heartbeat_fresh(tmp_path, now, problems) is True and problems == []
    write_lock_beat(tmp_path, now + 3 * 3600, interval=5.0)
    assert liveness.heartbeat_fresh(tmp_path, now, problems) is False
    assert liveness.heartbeat_fresh(tmp_path, now, problems) is False
    assert problems == ["writer.lock: its heartbeat is 3 h ahead of this clock (not counted as live)"]
    assert liveness.writer_alive(tmp_path, on_this_host=False, problems=problems) is False


def test_a_free_lock_is_conclusive_on_this_host_and_the_heartbeat_decides_for_another(tmp_path: Path) -> None:
    write_lock_beat(tmp_path, time.time())
    assert liveness.lock_held(tmp_path) is False
    assert liveness.writer_alive(tmp_path, on_this_host=True) is False  # a fresh beat, but the lock is free
    assert liveness.writer_alive(tmp_path, on_this_host=False) is True
    write_lock_beat(tmp_path, time.time() - 3600)
    assert liveness.writer_alive(tmp_path, on_this_host=False) is False


def test_a_lock_held_by_another_writer_is_live_and_the_second_writer_writes_no_heartbeat(tmp_path: Path) -> None:
    first = liveness.WriterLock(tmp_path, clock=lambda: 1_000_000.123)
    try:
        second = liveness.WriterLock(tmp_path, clock=lambda: 2.0)
        try:
            assert (first.held, second.held) == (True, False)
            assert json.loads((tmp_path / liveness.WRITER_FILE).read_text())["heartbeat"] == 1_000_000.123
            assert liveness.writer_alive(tmp_path, on_this_host=True) is True
        finally:
            second.release()
    finally:
        first.release()
    assert liveness.lock_held(tmp_path) is False
    first.release()  # twice: nothing left to let go of


def test_a_shorter_heartbeat_replaces_a_longer_one_whole(tmp_path: Path) -> None:
    stamps = iter([1_000_000.123, 2.0])
    lock = liveness.WriterLock(tmp_path, clock=lambda: next(stamps))
    try:
        lock.beat()
        written = json.loads((tmp_path / liveness.WRITER_FILE).read_text())
        assert (written["heartbeat"], written["interval"], written["host"]) == (2.0, 5.0, socket.gethostname())
    finally:
        lock.release()
    lock.beat()  # released: nothing is written
    assert json.loads((tmp_path / liveness.WRITER_FILE).read_text())["heartbeat"] == 2.0


def test_a_lock_file_that_cannot_be_opened_is_no_answer(tmp_path: Path) -> None:
    (tmp_path / liveness.WRITER_FILE).mkdir()
    assert liveness.lock_held(tmp_path) is None and liveness.heartbeat_fresh(tmp_path) is None


def store_run_files():
    from tpudash.runs.backends import runs_root

    return runs_root(f"memory://liveness-{uuid.uuid4().hex[:8]}/runs").files("run")


def test_in_a_store_the_chiefs_fresh_heartbeat_alone_keeps_a_run_live() -> None:
    files = store_run_files()
    now = time.time()
    assert liveness.store_writers_alive(files, now) is False  # never a heartbeat
    files.write("writers/w1.json", json.dumps({"heartbeat": now, "worker": 1}).encode())
    files.write("writers/w2.json", json.dumps({"heartbeat": now, "worker": True}).encode())  # no index: a writer
    assert liveness.store_writers_alive(files, now) is True
    files.write("writers/w2.json", json.dumps({"heartbeat": now - 15.01, "interval": 5}).encode())
    assert liveness.store_writers_alive(files, now) is False
    files.write("writers/w0.json", json.dumps({"heartbeat": now - 15.0, "worker": 0}).encode())
    assert liveness.store_writers_alive(files, now) is True


def test_in_a_store_a_refused_heartbeat_file_is_junk_named_with_why() -> None:
    files = store_run_files()
    files.write("writers/big.json", b" " * (liveness.MAX_HEARTBEAT_BYTES + 1))
    problems: list[str] = []
    assert liveness.store_writers_alive(files, time.time(), problems) is False
    assert problems == ["writers/: 1 file is no heartbeats (big.json: big.json: larger than 4 KiB); skipped"]


def test_a_heartbeat_is_a_non_chief_workers_only_with_a_whole_index_above_0() -> None:
    assert liveness.beats_for_another_worker(json.dumps({"heartbeat": 1.0, "worker": 1}).encode())
    for worker in (0, True, "1", None, 1.0):
        assert not liveness.beats_for_another_worker(json.dumps({"heartbeat": 1.0, "worker": worker}).encode())
    assert not liveness.beats_for_another_worker(b"not json")


def test_a_process_start_time_is_within_a_second_of_what_was_recorded() -> None:
    created = liveness.process_start_time(os.getpid())
    assert created is not None
    assert liveness.process_alive(os.getpid(), created + 1.0)
    assert liveness.process_alive(os.getpid(), created - 1.0)
    assert not liveness.process_alive(os.getpid(), created + 1.01)
    assert not liveness.process_alive(os.getpid(), created - 1.01)
    assert liveness.process_alive(os.getpid())  # nothing to compare: the pid alone
    assert liveness.process_start_time(2**22 + 1) is None


def test_an_older_runs_start_ticks_are_turned_into_a_start_time() -> None:
    import psutil

    ticks_per_second = os.sysconf("SC_CLK_TCK")
    created = psutil.Process(os.getpid()).create_time()
    ticks = round((created - psutil.boot_time()) * ticks_per_second)
    assert liveness.process_alive(os.getpid(), start_ticks=str(ticks))
    assert not liveness.process_alive(os.getpid(), start_ticks=str(ticks + 5 * ticks_per_second))
    assert liveness.process_alive(os.getpid(), start_ticks="not a number")  # no start time: the pid alone
    assert liveness._start_time_from_ticks("12x") is None


def test_an_exited_child_not_yet_collected_is_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited; left a zombie until collected
        assert liveness.process_alive(child.pid) is False
    finally:
        child.wait(timeout=WAIT)
    assert not liveness.process_alive(child.pid)


def test_asking_whether_a_lock_is_held_leaves_no_lock_behind(tmp_path: Path) -> None:
    write_lock_beat(tmp_path, time.time())
    assert liveness.lock_held(tmp_path) is False
    writer = liveness.WriterLock(tmp_path)
    try:
        assert writer.held, "a reader's shared lock was left behind"
    finally:
        writer.release()


def test_a_lock_that_cannot_be_taken_for_another_reason_raises_and_leaves_no_descriptor(tmp_path, monkeypatch) -> None:
    import errno
    import fcntl

    def no_locks_here(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "no locks on this file system")

    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(fcntl, "flock", no_locks_here)
    with pytest.raises(OSError, match="no locks"):
        liveness.WriterLock(tmp_path)
    assert len(os.listdir("/proc/self/fd")) == before


def test_the_heartbeat_is_stamped_to_the_millisecond_by_a_daemon_thread(tmp_path: Path) -> None:
    lock = liveness.WriterLock(tmp_path, interval=60.0, clock=lambda: 1000.12345).start()
    try:
        assert lock._thread is not None and lock._thread.daemon  # a process that never releases still exits
        assert json.loads((tmp_path / liveness.WRITER_FILE).read_text())["heartbeat"] == 1000.123
    finally:
        lock.release()


def test_exactly_as_many_heartbeats_as_are_read_is_no_problem() -> None:
    files = store_run_files()
    now = time.time()
    for number in range(liveness.MAX_WRITERS_READ):
        files.write(f"writers/w{number:03d}.json", json.dumps({"heartbeat": now - 3600}).encode())
    problems: list[str] = []
    assert liveness.store_writers_alive(files, now, problems) is False and problems == []
    files.write("writers/w999.json", json.dumps({"heartbeat": now - 3600}).encode())
    assert liveness.store_writers_alive(files, now, problems) is False
    assert problems == ["writers/: 257 files, more than a run has writers; the newest 256 were read"]


def test_a_process_that_does_not_exist_is_not_alive_and_one_of_another_user_is(monkeypatch) -> None:
    import psutil

    assert liveness.process_alive(2**22 + 1) is False

    class AnotherUsers:
        def __init__(self, pid: int) -> None:
            raise psutil.AccessDenied(pid)

    monkeypatch.setattr(psutil, "Process", AnotherUsers)
    assert liveness.process_alive(4242, 1.0)
    assert liveness.process_start_time(4242) is None


def test_one_heartbeat_is_fresh_or_not_by_the_rule_and_a_lock_file_past_the_cap_is_none(tmp_path: Path) -> None:
    now = time.time()
    assert liveness.beat_is_fresh(json.dumps({"heartbeat": now - 15.0}).encode(), now) is True
    assert liveness.beat_is_fresh(json.dumps({"heartbeat": now - 15.01}).encode(), now) is False
    assert liveness.beat_is_fresh(json.dumps({"heartbeat": now + 60}).encode(), now) is False
    data = json.dumps({"heartbeat": now}).encode()
    (tmp_path / liveness.WRITER_FILE).write_bytes(data + b" " * (liveness.MAX_HEARTBEAT_BYTES + 1 - len(data)))
    assert liveness.heartbeat_fresh(tmp_path, now) is None  # one byte past the cap: not a heartbeat


def test_reading_a_heartbeat_leaves_no_descriptor_open(tmp_path: Path) -> None:
    write_lock_beat(tmp_path, time.time())
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        assert liveness.heartbeat_fresh(tmp_path) is True
        assert liveness.lock_held(tmp_path) is False
    assert len(os.listdir("/proc/self/fd")) == before
