"""The review's reproductions (issue 38, items 5 and 6): heartbeats from the future, and junk that hid the real one.

Each is what a user notices: a run's status and liveness as ``tpudash runs``
and History read them (``RunStore.info``), a host's state as ``tpudash hosts``
prints it, and the problem line that names what was skipped. Stores are
``memory://`` (the same code as gs:// and s3://) and local directories.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path

import pytest

from tpudash.cli import main as cli
from tpudash.runs.backends import runs_root
from tpudash.runs.hosts import HOST_FILE, MAX_HOSTS, HostsReader, HostStatus, host_prefix, host_record
from tpudash.runs.layout import RUN_FILE, new_run_id
from tpudash.runs.liveness import MAX_WRITERS_READ, WRITER_FILE, WRITERS_FOLDER
from tpudash.runs.store import RunStore

YEAR_9999 = 253_402_128_000.0  # the last time (in 9999) every check of a timestamp lets through


def a_store_url() -> str:
    return f"memory://lying-beats-{uuid.uuid4().hex[:8]}/runs"


def running_record(run_id: str, host: str | None = "tpu-vm-7") -> bytes:
    record = {"run_id": run_id, "job": "train", "status": "running", "started": time.time() - 600, "pid": 4242}
    if host is not None:
        record["host"] = host
    return json.dumps(record).encode()


def a_beat(stamp: float, **more: object) -> bytes:
    return json.dumps({"heartbeat": stamp, "interval": 5.0, "pid": 4242, "host": "tpu-vm-7", **more}).encode()


# -- item 5: a heartbeat from the future is "clock ahead", never live ---------------------------------------


@pytest.mark.parametrize("stamp", [1e300, YEAR_9999], ids=["1e300", "year-9999"])
def test_a_writer_lock_heartbeat_from_the_future_on_a_run_of_another_host_is_not_live(
    tmp_path: Path, stamp: float
) -> None:
    store = RunStore(tmp_path / "runs")
    run_id = new_run_id("remote")
    files = store.backend.files(run_id)
    files.write(RUN_FILE, running_record(run_id))
    files.write(WRITER_FILE, a_beat(stamp))  # unlocked: its holder would be on another machine

    info = store.info(run_id)

    assert (info.live, info.status) == (False, "interrupted")
    assert any(
        problem.startswith(f"{WRITER_FILE}: its heartbeat is") and "ahead" in problem for problem in info.problems
    )


def test_a_buckets_writer_heartbeat_from_the_future_is_not_live_and_is_named() -> None:
    store = RunStore(a_store_url())
    run_id = new_run_id("remote")
    files = store.backend.files(run_id)
    files.write(RUN_FILE, running_record(run_id))
    files.write(f"{WRITERS_FOLDER}/x.json", a_beat(time.time() + 3 * 3600))

    info = store.info(run_id)

    assert (info.live, info.status) == (False, "stale")
    assert f"{WRITERS_FOLDER}/x.json: its heartbeat is 3 h ahead of this clock (not counted as live)" in info.problems


def test_a_heartbeat_a_little_ahead_is_live_and_one_past_the_skew_is_not() -> None:
    from tpudash.runs.heartbeat import CLOCK_SKEW_SECONDS

    store = RunStore(a_store_url())
    run_id = new_run_id("remote")
    files = store.backend.files(run_id)
    files.write(RUN_FILE, running_record(run_id))
    files.write(f"{WRITERS_FOLDER}/x.json", a_beat(time.time() + CLOCK_SKEW_SECONDS / 2))
    assert store.info(run_id).live

    files.write(f"{WRITERS_FOLDER}/x.json", a_beat(time.time() + CLOCK_SKEW_SECONDS + 60))
    assert not RunStore(store.root).info(run_id).live


def a_host(name: str, heartbeat: float, **changes: object) -> HostStatus:
    fields: dict = dict(
        name=name, hostname=name, heartbeat=heartbeat, interval=5.0, cpu_percent=100.0, memory_used=1 << 30,
        memory_total=8 << 30, chips=(), runs=(), problem=None, pid=4242,
    )  # fmt: skip
    fields.update(changes)
    return HostStatus(**fields)


def test_a_host_json_from_the_future_reads_clock_ahead_never_live(tmp_path: Path, capsys) -> None:
    runs_dir = tmp_path / "runs"
    runs_root(runs_dir).files(host_prefix("ahead")).write(HOST_FILE, host_record(a_host("ahead", YEAR_9999)))

    (host,) = HostsReader(runs_dir).read()
    assert host.state(time.time()) == "clock ahead" and not host.stale(time.time())
    assert host.to_dict(time.time())["state"] == "clock ahead"

    assert cli.main(["--runs-dir", str(runs_dir), "hosts"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "ahead" in line)
    assert "clock ahead more than a year" in row
    assert "live" not in row and "0 s ago" not in row


# -- item 6: junk never hides the real thing -----------------------------------------------------------------


def test_256_junk_heartbeats_sorted_ahead_of_the_real_one_do_not_make_a_live_run_stale() -> None:
    store = RunStore(a_store_url())
    run_id = new_run_id("remote")
    files = store.backend.files(run_id)
    files.write(RUN_FILE, running_record(run_id))
    for number in range(MAX_WRITERS_READ):
        files.write(f"{WRITERS_FOLDER}/a{number:03d}.json", b"{}")
    # The writer replaces its heartbeat every interval: the newest file of the folder.
    files.write(f"{WRITERS_FOLDER}/f00d01.json", a_beat(time.time()))

    info = store.info(run_id)

    assert (info.live, info.status) == (True, "running")
    assert any(f"{WRITERS_FOLDER}/: " in problem and "newest 256 were read" in problem for problem in info.problems)


def test_junk_heartbeats_of_a_dead_writer_are_counted_and_named() -> None:
    store = RunStore(a_store_url())
    run_id = new_run_id("remote")
    files = store.backend.files(run_id)
    files.write(RUN_FILE, running_record(run_id))
    files.write(f"{WRITERS_FOLDER}/f00d01.json", a_beat(time.time() - 3600))
    for number in range(3):
        files.write(f"{WRITERS_FOLDER}/a{number:03d}.json", b"not json")
    files.write(f"{WRITERS_FOLDER}/notes.txt", b"hello")

    info = store.info(run_id)

    assert (info.live, info.status) == (False, "stale")
    (line,) = [problem for problem in info.problems if problem.startswith(f"{WRITERS_FOLDER}/: ")]
    assert line.startswith(f"{WRITERS_FOLDER}/: 4 files are no heartbeats (")
    assert "notes.txt: not a heartbeat's name" in line and "a002.json: not JSON" in line  # newest first
    assert line.endswith("; …); skipped")


def make_junk_host_folders(runs_dir: Path | str, count: int) -> None:
    """``count`` folders ``hosts/a0000``… that hold no host.json: empty locally, with a stray object in a store."""
    root = runs_root(runs_dir)
    for number in range(count):
        name = f"a{number:04d}"
        if isinstance(runs_dir, Path):
            (runs_dir / "hosts" / name).mkdir(parents=True)
        else:
            root.files(host_prefix(name)).write("junk.txt", b"")


@pytest.mark.parametrize("where", ["local", "memory"])
def test_1024_empty_host_folders_do_not_hide_the_host_that_reports(tmp_path: Path, capsys, where: str) -> None:
    runs_dir: Path | str = tmp_path / "runs" if where == "local" else a_store_url()
    runs_root(runs_dir).files(host_prefix("tpu-vm-0")).write(HOST_FILE, host_record(a_host("tpu-vm-0", time.time())))
    make_junk_host_folders(runs_dir, MAX_HOSTS)  # after the real one: newer, and first by name

    assert cli.main(["--runs-dir", str(runs_dir), "hosts"]) == 0

    out, err = capsys.readouterr()
    assert "tpu-vm-0" in out and "live" in out
    assert "no host reports" not in err
    assert re.search(r"hosts/: 1,024 folders hold no host.json \(a\d{4}, a\d{4}, a\d{4}, …\); skipped", err), err


def test_past_the_folders_read_the_newest_are_read_first_and_the_rest_counted(tmp_path: Path) -> None:
    runs_dir = tmp_path / "runs"
    make_junk_host_folders(runs_dir, 5000)
    for folder in (runs_dir / "hosts").iterdir():
        os.utime(folder, (time.time() - 3600, time.time() - 3600))
    runs_root(runs_dir).files(host_prefix("zz-real")).write(HOST_FILE, host_record(a_host("zz-real", time.time())))
    reader = HostsReader(runs_dir)

    assert [host.name for host in reader.read()] == ["zz-real"]
    assert "hosts/: 905 more folders not read (at most 1024 hosts and 4096 folders are read)" in reader.problems
    assert any(problem.startswith("hosts/: 4,095 folders hold no host.json") for problem in reader.problems)
