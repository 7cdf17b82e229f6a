"""The agent's own rules, each branch pinned: its names and interval, the snapshot it writes, which host is "here".

And its schedule and its failures as a user notices them: a scan of the
runs every ``RUNS_SCAN_SECONDS`` (not at every tick), a store that stops
taking host.json said once and its return said once, a failing sample
said and the sampling going on, a stop that leaves what the store did not
take on disk with one line saying where. The agent runs in this process on
a local runs directory with a scripted sampler and a fake clock; the agent
as a process is tests/functional/test_agents.py.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from pathlib import Path

import pytest

from jobs.events import Telemetry
from tpudash.runs.hosts import MAX_CHIPS, MAX_RUNS, MAX_TEXT_CHARS, HostsReader
from tpudash.telemetry import agent as agent_module
from tpudash.telemetry.agent import (
    RUNS_SCAN_SECONDS,
    HostAgent,
    LiveRunsOnHost,
    check_interval,
    default_host_name,
    host_of,
    run_agent,
    snapshot,
    this_machines_addresses,
)

GIB = 1 << 30


def a_sample(chips: list[dict], cores: list, **host: object) -> Telemetry:
    return Telemetry(chips=chips, host={"cpu_pct": cores, **host}, unavailable={})


def test_a_snapshot_keeps_the_chips_a_reader_accepts_and_clamps_their_figures() -> None:
    chips = [
        {"chip": 0, "duty_cycle_pct": 150.0, "hbm_used": 0, "hbm_total": 16 * GIB},
        {"chip": -1, "duty_cycle_pct": 5.0},
        {"chip": True, "duty_cycle_pct": 5.0},
        {"chip": "2", "duty_cycle_pct": 5.0},
        {"chip": 3, "duty_cycle_pct": -5.0, "hbm_used": -1, "hbm_total": "16"},
        {"chip": 4, "duty_cycle_pct": float("nan")},
        {"chip": 5, "duty_cycle_pct": 42},
    ]
    status = snapshot("sim-1", "vm", 100.0, 5.0, a_sample(chips, [20.0, 40.0, "busy"]), ["r1", "r2"])

    assert [chip.index for chip in status.chips] == [0, 3, 4, 5]
    assert [chip.duty_cycle for chip in status.chips] == [100.0, 0.0, None, 42.0]
    assert [(chip.hbm_used, chip.hbm_total) for chip in status.chips][:2] == [(0, 16 * GIB), (None, None)]
    assert (status.name, status.hostname, status.heartbeat, status.interval) == ("sim-1", "vm", 100.0, 5.0)
    assert (status.cpu_percent, status.runs, status.problem, status.stopped) == (30.0, ("r1", "r2"), None, False)


def test_a_snapshot_clamps_the_cpu_cuts_what_is_too_long_and_names_itself_when_nameless() -> None:
    sample = Telemetry(
        chips=[{"chip": index} for index in range(MAX_CHIPS + 10)],
        host={"cpu_pct": [150.0, 150.0], "memory_used": 2 * GIB, "memory_total": 8 * GIB},
        unavailable={"tpu": "x" * (MAX_TEXT_CHARS + 100)},
    )
    status = snapshot("sim-1", "", 1.0, 5.0, sample, [f"r{index}" for index in range(MAX_RUNS + 5)])

    assert len(status.chips) == MAX_CHIPS and len(status.runs) == MAX_RUNS
    assert status.cpu_percent == 100.0 and status.hostname == "sim-1"
    assert status.problem == "x" * MAX_TEXT_CHARS
    assert (status.memory_used, status.memory_total) == (2 * GIB, 8 * GIB)
    assert snapshot("s", "h", 1.0, 5.0, a_sample([], [-10.0]), []).cpu_percent == 0.0
    assert snapshot("s", "h", 1.0, 5.0, a_sample([], []), []).cpu_percent is None
    assert snapshot("s", "h" * (MAX_TEXT_CHARS + 1), 1.0, 5.0, a_sample([], []), []).hostname == "h" * MAX_TEXT_CHARS


@pytest.mark.parametrize(
    ("address", "host"),
    [
        ("10.0.0.3:2222", "10.0.0.3"),
        ("vm-1:2222", "vm-1"),
        ("vm-1", "vm-1"),
        ("[fe80::1]:2222", "fe80::1"),
        ("fe80::1", "fe80::1"),  # a bare v6 address has no port to strip
    ],
)
def test_a_workers_host_is_its_address_without_tf_configs_port(address: str, host: str) -> None:
    assert host_of(address) == host


def test_this_machines_addresses_leave_loopback_out() -> None:
    addresses = this_machines_addresses()
    assert all(not ipaddress.ip_address(address).is_loopback for address in addresses)
    assert "127.0.0.1" not in addresses and "::1" not in addresses


@pytest.mark.parametrize(
    ("address", "here"),
    [
        ("vm-1", True),
        ("VM-1:2222", True),
        ("vm-1.zone.internal", True),  # a short name and its qualified one name one machine
        ("vm-2", False),
        ("vm-2.zone.internal", False),
        ("192.0.2.7:2222", False),  # another machine's address
        ("127.0.0.1:2222", False),  # every machine's loopback: never taken for this one
    ],
)
def test_a_writers_host_is_this_one_by_name_short_or_qualified(tmp_path: Path, address: str, here: bool) -> None:
    runs = LiveRunsOnHost(tmp_path / "runs", "vm-1.zone.internal", spill_root=None, clock=lambda: 0.0)
    assert runs.addresses == set()  # not this machine's hostname: no addresses of its own
    assert runs._is_here(address) is here


def test_this_machines_own_address_is_here(tmp_path: Path) -> None:
    runs = LiveRunsOnHost(tmp_path / "runs", socket.gethostname(), spill_root=None, clock=lambda: 0.0)
    assert runs.addresses == this_machines_addresses()
    for address in runs.addresses:
        assert runs._is_here(f"{address}:2222") or ":" in address


@pytest.mark.parametrize("text", ["0.1", "600", 5.0, "5"])
def test_an_interval_from_a_tenth_of_a_second_to_ten_minutes_is_allowed(text: object) -> None:
    assert check_interval(text) == float(text)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["0.099", "600.01", "inf", "-1", None])
def test_an_interval_outside_is_refused_saying_what_is_allowed(text: object) -> None:
    with pytest.raises(ValueError, match=r"allowed: seconds from 0.1 to 600"):
        check_interval(text)  # type: ignore[arg-type]


def test_a_default_host_name_is_a_plain_name_of_at_most_64_characters() -> None:
    assert default_host_name(".-vm") == "vm"
    assert default_host_name("") == "host" and default_host_name("..") == "host"
    assert default_host_name("v" * 70) == "v" * 64
    assert default_host_name() == default_host_name(socket.gethostname())


# -- the agent's schedule and failures -----------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Sampler:
    """One chip, its duty cycle the sample's number; ``fail_on``: the samples that raise; ``stop``: set after it."""

    def __init__(self, fail_on: tuple[int, ...] = (), stop_after: int | None = None, stop=None) -> None:
        self.taken = 0
        self.fail_on = fail_on
        self.stop_after = stop_after
        self.stop = stop
        self.closed = False

    def sample(self, processes: object = None) -> tuple[float, Telemetry]:
        self.taken += 1
        if self.stop is not None and self.stop_after is not None and self.taken >= self.stop_after:
            self.stop.set()
        if self.taken in self.fail_on:
            raise OSError(f"sample {self.taken} failed")
        return 0.0, a_sample([{"chip": 0, "duty_cycle_pct": float(self.taken)}], [10.0])

    def close(self) -> None:
        self.closed = True


# The machine an agent under test says it runs on: no test machine's name.
SIMULATED = "sim-vm-7f3a"


def an_agent(tmp_path: Path, sampler: Sampler, clock: Clock, said: list[str], **options) -> HostAgent:
    options.setdefault("hostname", SIMULATED)
    return HostAgent(
        tmp_path / "runs", SIMULATED, sampler, interval=0.01, spill_root=tmp_path / "unsent", clock=clock,
        notify=said.append, **options,
    )  # fmt: skip


def test_only_the_agent_named_for_its_machine_records_runs(tmp_path: Path) -> None:
    said: list[str] = []
    assert an_agent(tmp_path, Sampler(), Clock(), said).records_runs
    other = HostAgent(tmp_path / "runs", "sim-1", Sampler(), hostname=SIMULATED, spill_root=tmp_path / "unsent")
    assert not other.records_runs
    told = HostAgent(tmp_path / "runs", "sim-1", Sampler(), hostname=SIMULATED, records_runs=True, spill_root=tmp_path)
    assert told.records_runs
    mine = HostAgent(tmp_path / "runs", default_host_name(), Sampler(), spill_root=tmp_path / "unsent")
    assert mine.hostname == socket.gethostname() and mine.records_runs


def test_the_runs_are_scanned_every_scan_interval_not_at_every_tick(tmp_path: Path, monkeypatch) -> None:
    clock = Clock()
    agent = an_agent(tmp_path, Sampler(), clock, [])
    scans: list[float] = []
    monkeypatch.setattr(agent.runs, "scan", lambda: scans.append(clock()) or [])
    start = clock.now
    agent.tick()
    clock.now = start + RUNS_SCAN_SECONDS - 0.001
    agent.tick()
    clock.now = start + RUNS_SCAN_SECONDS
    agent.tick()
    assert scans == [start, start + RUNS_SCAN_SECONDS]
    assert agent.ticks == 3

    simulated = HostAgent(tmp_path / "runs", "sim-1", Sampler(), hostname=SIMULATED, spill_root=tmp_path, clock=clock)
    monkeypatch.setattr(simulated.runs, "scan", lambda: scans.append(-1.0) or [])
    simulated.tick()
    assert -1.0 not in scans, "an agent that records no run scans none"


class FailingFiles:
    """The host's files in a store that refuses every write while ``down``."""

    def __init__(self, files) -> None:
        self.files = files
        self.where = files.where
        self.down = True

    def write(self, name: str, data: bytes) -> None:
        if self.down:
            raise ConnectionRefusedError("the store is down")
        self.files.write(name, data)


def test_a_store_that_stops_taking_host_json_is_said_once_and_its_return_once(tmp_path: Path) -> None:
    said: list[str] = []
    agent = an_agent(tmp_path, Sampler(), Clock(), said, records_runs=False)
    failing = FailingFiles(agent.files)
    agent.files = failing  # type: ignore[assignment]
    agent.tick()
    agent.tick()
    assert len(said) == 1 and "ConnectionRefusedError: the store is down" in said[0]
    assert "the agent goes on sampling" in said[0]
    assert agent.last_error is not None and agent.ticks == 2
    assert HostsReader(tmp_path / "runs").read() == []

    failing.down = False
    agent.tick()
    agent.tick()
    assert said[1:] == [f"{failing.where}: the store takes host.json again"]
    assert agent.last_error is None
    (host,) = HostsReader(tmp_path / "runs").read()
    assert host.chips[0].duty_cycle == 4.0


def test_runs_that_cannot_be_listed_are_said_and_the_runs_found_before_are_kept(tmp_path: Path, monkeypatch) -> None:
    said: list[str] = []
    clock = Clock()
    agent = an_agent(tmp_path, Sampler(), clock, said)
    agent.live_runs = ["20261121-025100-train-1a2b3c"]

    def unreachable() -> list:
        raise OSError("listing refused")

    monkeypatch.setattr(agent.runs, "scan", unreachable)
    agent.tick()
    assert agent.live_runs == ["20261121-025100-train-1a2b3c"]
    assert len(said) == 1 and "cannot list the runs: OSError: listing refused" in said[0]


def test_the_agent_samples_on_schedule_says_a_failed_sample_and_goes_on_until_stopped(tmp_path: Path) -> None:
    said: list[str] = []
    stop = threading.Event()
    sampler = Sampler(fail_on=(2,), stop_after=4, stop=stop)
    agent = an_agent(tmp_path, sampler, Clock(), said, records_runs=False)

    agent.run(stop)  # returns once the 4th sample set the stop

    assert sampler.taken == 4 and agent.ticks == 3
    assert said == [
        "sampling failed: OSError: sample 2 failed (the agent goes on sampling; its samples wait on this host's disk)"
    ]
    assert stop.is_set()
    assert agent.close(timeout=5.0) and sampler.closed
    (host,) = HostsReader(tmp_path / "runs").read()
    assert host.stopped


class UnfinishedAgent:
    """What ``run_agent`` drives: an agent whose store did not take everything by the stop."""

    name = "vm"
    spill_root = Path("/tmp/tpudash-unsent")

    def __init__(self) -> None:
        self.closed_within: float | None = None

    def run(self, stop: threading.Event) -> None:
        stop.set()

    def close(self, timeout: float) -> bool:
        self.closed_within = timeout
        return False


def test_a_stop_that_leaves_samples_unsent_says_where_they_are(capsys) -> None:
    agent = UnfinishedAgent()
    assert run_agent(agent, threading.Event(), timeout=4.0) is False  # type: ignore[arg-type]
    assert agent.closed_within == 2.0
    assert capsys.readouterr().err == (
        "tpudash: agent vm: the store did not take every sample within 4 s; the rest is kept in /tmp/tpudash-unsent\n"
    )


def test_the_module_says_its_bounds() -> None:
    assert (agent_module.RUNS_SCAN_SECONDS, agent_module.ADOPT_AFTER_SECONDS) == (15.0, 10.0)
    assert (agent_module.STORE_RENEW_SECONDS, agent_module.STOP_WAIT_SECONDS) == (3600.0, 5.0)
    assert (agent_module.SAMPLES_SEAL_SECONDS, agent_module.INTERVAL_RANGE) == (10.0, (0.1, 600.0))
    assert (agent_module.MAX_RUNS_SCANNED, agent_module.MAX_RUNS_RECORDED, agent_module.MAX_WRITERS_ASKED) == (
        200,
        32,
        16,
    )


def test_an_ip_named_host_is_here_by_its_name(tmp_path: Path) -> None:
    runs = LiveRunsOnHost(tmp_path / "runs", "10.0.0.5", spill_root=None, clock=lambda: 0.0)
    assert runs._is_here("10.0.0.5:2222") and not runs._is_here("10.0.0.6:2222")


def test_this_machines_addresses_are_plain_ip_addresses_without_scope_or_link_layer(monkeypatch) -> None:
    from collections import namedtuple

    import psutil

    Entry = namedtuple("Entry", "address")
    interfaces = {
        "eth0": [Entry("10.1.2.3"), Entry("aa:bb:cc:dd:ee:ff"), Entry("fe80::1%eth0")],
        "lo": [Entry("127.0.0.1"), Entry("::1")],
    }
    monkeypatch.setattr(psutil, "net_if_addrs", lambda: interfaces)
    assert this_machines_addresses() == {"10.1.2.3", "fe80::1"}

    def refused() -> dict:
        raise OSError("no interfaces to be seen")

    monkeypatch.setattr(psutil, "net_if_addrs", refused)
    assert this_machines_addresses() == set()


def test_the_store_of_runs_is_renewed_after_an_hour_to_drop_its_caches(tmp_path: Path) -> None:
    clock = Clock()
    runs = LiveRunsOnHost(tmp_path / "runs", "vm", spill_root=None, clock=clock)
    first = runs.store
    clock.now += agent_module.STORE_RENEW_SECONDS - 0.001
    assert runs.scan() == [] and runs.store is first
    clock.now += 0.001
    assert runs.scan() == [] and runs.store is not first


def test_an_interrupt_while_sampling_ends_the_schedule_with_the_stop_set(tmp_path: Path) -> None:
    class Interrupted(Sampler):
        def sample(self, processes: object = None) -> tuple[float, Telemetry]:
            raise KeyboardInterrupt

    stop = threading.Event()
    agent = an_agent(tmp_path, Interrupted(), Clock(), [], records_runs=False)
    with pytest.raises(KeyboardInterrupt):
        agent.run(stop)
    assert stop.is_set(), "the caller waiting on the stop would wait forever"
    agent.close(timeout=5.0)


def test_the_schedule_waits_an_interval_between_samples(tmp_path: Path) -> None:
    import time

    stop = threading.Event()
    agent = an_agent(tmp_path, Sampler(stop_after=4, stop=stop), Clock(), [], records_runs=False)
    agent.interval = 0.05
    started = time.monotonic()
    agent.run(stop)
    assert time.monotonic() - started >= 3 * 0.05
    agent.close(timeout=5.0)


def test_a_stopped_report_the_store_refuses_is_said_and_the_stop_goes_on(tmp_path: Path) -> None:
    said: list[str] = []
    agent = an_agent(tmp_path, Sampler(), Clock(), said, records_runs=False)
    agent.tick()
    failing = FailingFiles(agent.files)
    agent.files = failing  # type: ignore[assignment]
    agent.close(timeout=5.0)
    assert len(said) == 1 and f"{failing.where}/host.json: ConnectionRefusedError" in said[0]
    (host,) = HostsReader(tmp_path / "runs").read()
    assert not host.stopped  # its last report stands: readers will find it stale


def test_an_agent_that_never_reported_stops_at_once(tmp_path: Path) -> None:
    import time

    agent = an_agent(tmp_path, Sampler(), Clock(), [], records_runs=False)
    started = time.monotonic()
    assert agent.close(timeout=60.0)
    assert time.monotonic() - started < 30.0, "the stop waited for a report that was never to be written"


def test_a_stop_the_store_does_not_take_keeps_the_samples_on_this_hosts_disk(tmp_path: Path) -> None:
    said: list[str] = []
    agent = an_agent(tmp_path, Sampler(), Clock(), said, records_runs=False)
    agent.samples.files = FailingFiles(agent.samples.files)  # type: ignore[assignment]
    for _ in range(3):
        agent.tick()

    assert agent.close(timeout=0.5) is False
    kept = b"".join(path.read_bytes() for path in (tmp_path / "unsent").rglob("*.jsonl"))
    assert len(kept.splitlines()) == 3, "samples the store did not take were lost"
