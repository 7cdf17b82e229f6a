"""Hosts in the runs directory: what an agent writes, what ``HostsReader`` reads back, and what it refuses.

On a ``memory://`` store (the same code as gs:// and s3://) and on a local
directory: every field read back, a bad host.json skipped and named while
the other hosts still read, a host stale once three of its intervals pass
(at a fixed ``now``), and ``hosts/`` never listed as a run. The agent's
ticks are driven here with a scripted sampler; the agent as a process, with
its fake metrics services and a bucket, is tests/functional/test_agents.py.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from jobs.events import RunFinished, Telemetry
from tpudash.cli.hosts import hosts_table
from tpudash.runs.backends import runs_root
from tpudash.runs.hosts import (
    HOST_FILE,
    ChipStatus,
    HostsReader,
    HostStatus,
    host_prefix,
    host_record,
)
from tpudash.runs.store import RunStore
from tpudash.telemetry.agent import HostAgent, check_host_name, check_interval, default_host_name

GIB = 1 << 30
NOW = 1_800_000_000.0


def a_host(name: str = "tpu-vm-0", heartbeat: float = NOW, interval: float = 5.0) -> HostStatus:
    return HostStatus(
        name=name,
        hostname=f"{name}.internal",
        heartbeat=heartbeat,
        interval=interval,
        cpu_percent=12.5,
        memory_used=3 * GIB,
        memory_total=16 * GIB,
        chips=(ChipStatus(0, 87.5, 4 * GIB, 16 * GIB), ChipStatus(1, None, None, 16 * GIB)),
        runs=("20261121-025100-train-1a2b3c",),
        problem=None,
        pid=4242,
    )


@pytest.fixture(params=["memory", "local"])
def runs_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    if request.param == "memory":
        return f"memory://hosts-{uuid.uuid4().hex[:8]}/runs"
    return tmp_path / "runs"


def put(runs_dir: Path | str, name: str, data: bytes) -> None:
    runs_root(runs_dir).files(host_prefix(name)).write(HOST_FILE, data)


def test_every_field_of_every_host_is_read_back_sorted_by_name(runs_dir: Path | str) -> None:
    for name in ("host-b", "host-a"):
        put(runs_dir, name, host_record(a_host(name)))

    hosts = HostsReader(runs_dir).read()

    assert [host.name for host in hosts] == ["host-a", "host-b"]
    assert hosts[0] == a_host("host-a")
    assert hosts[0].chips[0] == ChipStatus(index=0, duty_cycle=87.5, hbm_used=4 * GIB, hbm_total=16 * GIB)


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (host_record(a_host("someone-else")), "name must be the host's folder name"),
        (json.dumps({"name": "bad", "heartbeat": "yesterday", "interval": 5}).encode(), "heartbeat must be"),
        (json.dumps({"name": "bad", "heartbeat": NOW, "interval": -1}).encode(), "interval must be"),
        (
            json.dumps(
                {"name": "bad", "heartbeat": NOW, "interval": 5, "chips": [{"index": 0, "duty_cycle": 250}]}
            ).encode(),
            "chips[0].duty_cycle must be a number from 0 to 100",
        ),
        (json.dumps({"name": "bad", "heartbeat": NOW, "interval": 5, "runs": ["../x"]}).encode(), "runs must hold"),
        (b" " * (65 << 10), "larger than 64 KiB"),
    ],
)
def test_a_bad_host_file_is_skipped_and_named_and_the_others_still_read(
    runs_dir: Path | str, data: bytes, named: str
) -> None:
    put(runs_dir, "good", host_record(a_host("good")))
    put(runs_dir, "bad", data)
    reader = HostsReader(runs_dir)

    hosts = reader.read()

    assert [host.name for host in hosts] == ["good"]
    assert len(reader.problems) == 1
    assert reader.problems[0].startswith("hosts/bad/host.json: ")
    assert named in reader.problems[0]


def test_a_host_turns_stale_after_three_of_its_own_intervals(runs_dir: Path | str) -> None:
    put(runs_dir, "fast", host_record(a_host("fast", heartbeat=NOW, interval=0.5)))
    put(runs_dir, "slow", host_record(a_host("slow", heartbeat=NOW, interval=5.0)))
    fast, slow = HostsReader(runs_dir).read()

    assert not fast.stale(NOW + 1.5) and fast.stale(NOW + 1.6)
    assert not slow.stale(NOW + 15.0) and slow.stale(NOW + 15.1)
    assert fast.to_dict(NOW + 2)["stale"] is True and fast.to_dict(NOW + 2)["age"] == 2.0
    assert slow.state(NOW - 3) == "live"  # an agent's clock a little ahead of the reader's: within the skew
    assert slow.state(NOW - 60) == "clock ahead" and not slow.stale(NOW - 60)


def test_hosts_is_never_listed_as_a_run(runs_dir: Path | str) -> None:
    store = RunStore(runs_dir)
    recorder = store.create("20261121-025100-matmul-1a2b3c", "matmul", {}, {})
    recorder.record(RunFinished(status="done", summary={}, error=None, traceback=None))
    put(runs_dir, "tpu-vm-0", host_record(a_host()))

    assert store.run_ids() == ["20261121-025100-matmul-1a2b3c"]
    assert [run.run_id for run in store.list_runs()] == ["20261121-025100-matmul-1a2b3c"]


def test_nothing_reports_in_a_runs_directory_without_hosts(runs_dir: Path | str) -> None:
    reader = HostsReader(runs_dir)
    assert reader.read() == [] and reader.problems == []


class ScriptedSampler:
    """Two chips whose duty cycle climbs by one per sample; the host's CPU and memory fixed."""

    def __init__(self) -> None:
        self.samples = 0

    def sample(self, processes: object = None) -> tuple[float, Telemetry]:
        self.samples += 1
        chips = [
            {"chip": chip, "duty_cycle_pct": float(self.samples % 100), "hbm_used": GIB, "hbm_total": 16 * GIB}
            for chip in range(2)
        ]
        host = {"cpu_pct": [10.0, 30.0], "memory_used": 2 * GIB, "memory_total": 8 * GIB}
        return NOW + self.samples, Telemetry(chips=chips, host=host, unavailable={})

    def close(self) -> None:
        pass


def test_an_agent_tick_reports_the_host_and_appends_its_sample(runs_dir: Path | str, tmp_path: Path) -> None:
    agent = HostAgent(runs_dir, "sim-1", ScriptedSampler(), interval=0.5, hostname="vm", spill_root=tmp_path / "unsent")
    for _ in range(3):
        agent.tick()

    (host,) = HostsReader(runs_dir).read()
    assert (host.name, host.hostname, host.interval, host.cpu_percent) == ("sim-1", "vm", 0.5, 20.0)
    assert [chip.duty_cycle for chip in host.chips] == [3.0, 3.0]
    assert (host.memory_used, host.memory_total) == (2 * GIB, 8 * GIB)
    assert not host.stopped
    assert agent.close(timeout=5.0)
    samples = runs_root(runs_dir).files(host_prefix("sim-1"))
    lines = b"".join(samples.read(f"samples/{name}", 1 << 20) for name in samples.list("samples")).splitlines()
    assert len(lines) == 3 and all(json.loads(line)["type"] == "telemetry" for line in lines)


def test_agent_names_and_intervals_are_checked_with_what_is_allowed() -> None:
    assert check_host_name("tpu-vm_1.zone") == "tpu-vm_1.zone"
    for bad in ("", "../up", "a/b", "-flag", ".hidden", "x" * 65, "with space"):
        with pytest.raises(ValueError, match="allowed: a plain name of 1 to 64 letters"):
            check_host_name(bad)
    assert (
        default_host_name("t1v-n-1a2b.us-central2-b.c.project.internal")
        == "t1v-n-1a2b.us-central2-b.c.project.internal"
    )
    assert default_host_name("odd name!") == "odd_name_"
    assert check_interval("0.5") == 0.5
    for bad in ("0", "nan", "fast", "601"):
        with pytest.raises(ValueError, match="allowed: seconds from 0.1 to 600"):
            check_interval(bad)


def test_the_hosts_table_says_which_host_is_stale() -> None:
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(hosts_table([a_host("live-one"), a_host("gone-one", heartbeat=NOW - 60)], NOW))
    text = console.export_text()
    live_line = next(line for line in text.splitlines() if "live-one" in line)
    gone_line = next(line for line in text.splitlines() if "gone-one" in line)
    assert "live" in live_line and "88 -%" in live_line and "0 s ago" in live_line
    assert "stale" in gone_line and "60 s ago" in gone_line


def test_a_cleanly_stopped_agent_says_stopped_and_its_last_figures_are_not_shown_as_current(
    runs_dir: Path | str, tmp_path: Path
) -> None:
    from rich.console import Console

    agent = HostAgent(runs_dir, "sim-1", ScriptedSampler(), interval=0.5, hostname="vm", spill_root=tmp_path / "unsent")
    agent.tick()
    assert agent.close(timeout=5.0)

    (host,) = HostsReader(runs_dir).read()
    an_hour_later = host.heartbeat + 3600
    assert host.stopped and host.state(an_hour_later) == "stopped" and not host.stale(an_hour_later)
    assert (host.cpu_percent, host.memory_used, host.runs) == (None, None, ())
    assert [(chip.duty_cycle, chip.hbm_used, chip.hbm_total) for chip in host.chips] == [(None, None, 16 * GIB)] * 2
    assert host.to_dict(an_hour_later)["state"] == "stopped"

    console = Console(width=160, record=True)
    console.print(hosts_table([host, a_host("busy", heartbeat=an_hour_later)], an_hour_later))
    row = next(line for line in console.export_text().splitlines() if "sim-1" in line)
    assert "stopped 60 min ago" in row and "%" not in row and "GiB" not in row


def test_a_tick_that_outlives_the_stop_does_not_overwrite_the_stopped_report(runs_dir: Path | str, tmp_path: Path):
    agent = HostAgent(runs_dir, "sim-1", ScriptedSampler(), interval=0.5, hostname="vm", spill_root=tmp_path / "unsent")
    agent.tick()
    assert agent.close(timeout=5.0)
    agent.tick()  # the ticking thread, late

    (host,) = HostsReader(runs_dir).read()
    assert host.stopped


def test_an_agent_that_never_reported_writes_nothing_when_it_stops(runs_dir: Path | str, tmp_path: Path) -> None:
    agent = HostAgent(runs_dir, "sim-1", ScriptedSampler(), interval=0.5, hostname="vm", spill_root=tmp_path / "unsent")
    assert agent.close(timeout=5.0)
    assert HostsReader(runs_dir).read() == []


def test_stopped_must_be_true_or_false(runs_dir: Path | str) -> None:
    record = json.loads(host_record(a_host("odd")))
    put(runs_dir, "odd", json.dumps(dict(record, stopped="yes")).encode())
    reader = HostsReader(runs_dir)
    assert reader.read() == []
    assert reader.problems == ["hosts/odd/host.json: stopped must be true or false, not 'yes'; skipped"]


@pytest.mark.parametrize(
    ("heartbeat", "state", "cell"),
    [
        (NOW - 15.0, "live", "live 15 s ago"),
        (NOW - 15.1, "stale", "stale 15 s ago"),
        (NOW + 5.0, "live", "live 0 s ago"),  # within the clocks' skew
        (NOW + 5.1, "clock ahead", "clock ahead 5 s"),
        (NOW + 7200, "clock ahead", "clock ahead 2 h"),
    ],
)
def test_a_hosts_state_is_the_one_rule_at_its_boundaries(heartbeat: float, state: str, cell: str) -> None:
    from rich.console import Console

    host = a_host("edge", heartbeat=heartbeat, interval=5.0)
    assert host.state(NOW) == state
    assert host.to_dict(NOW)["stale"] is (state == "stale")
    console = Console(width=160, record=True)
    console.print(hosts_table([host], NOW))
    assert cell in console.export_text()


LONG_PROBLEM = (
    "no TPU metrics service at localhost:8431: connection refused "
    "(libtpu serves it while a TensorFlow or JAX process holds the TPU)"
)


def two_hosts(now: float) -> list[HostStatus]:
    """A host whose metrics service is down (its problem long) and a busy one, as of ``now``."""
    down = a_host("t1v-n-1a2b-w-0", heartbeat=now - 1)
    down = HostStatus(**{**down.__dict__, "chips": (), "problem": LONG_PROBLEM})
    return [down, a_host("t1v-n-1a2b-w-1", heartbeat=now - 2)]


def printed_hosts(width: int) -> str:
    """What ``tpudash hosts`` prints on a terminal ``width`` columns wide."""
    import io

    from rich.console import Console

    from tpudash.cli.hosts import print_hosts

    console = Console(file=io.StringIO(), width=width, record=True, force_terminal=True)
    print_hosts(console, two_hosts(NOW), NOW)
    return console.export_text()


@pytest.mark.parametrize("width", [160, 100, 80])
def test_tpudash_hosts_on_a_terminal_cuts_no_cell_and_says_a_hosts_problem_whole(width: int) -> None:
    text = printed_hosts(width)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines)
    assert "…" not in text, "a cell was cut"
    table_rows = [line for line in lines if line.startswith("│")]
    assert len(table_rows) == 2, f"a row wrapped:\n{text}"
    assert "none ⚠" in table_rows[0] and "live 1 s ago" in table_rows[0]
    assert " ".join(text.split()).endswith(f"⚠ t1v-n-1a2b-w-0: {LONG_PROBLEM}")


def test_tpudash_hosts_piped_prints_one_line_per_host_whole_and_unpadded(tmp_path: Path, capsys) -> None:
    import time

    from tpudash.cli import main as cli

    runs_dir = tmp_path / "runs"
    for host in two_hosts(time.time()):
        put(runs_dir, host.name, host_record(host))

    assert cli.main(["--runs-dir", str(runs_dir), "hosts"]) == 0

    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == 2 and "t1v-n-1a2b-w-0.internal" in rows[0] and "20261121-025100-train-1a2b3c" in rows[1]
    assert f"⚠ t1v-n-1a2b-w-0: {LONG_PROBLEM}" in lines
    assert not any(line.endswith(" ") for line in lines)
