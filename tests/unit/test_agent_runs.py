"""The agent records the telemetry of the live runs on its host, each sample once, and of no other run.

On a ``memory://`` store (the same code as gs:// and s3://) and on a local
directory, with real run recorders in this process (a store's heartbeat, a
local writer's lock) and an in-process ``HostAgent`` driven tick by tick on
a fake clock: what a user notices is the run's exported telemetry (the
samples ``tpudash export RUN`` shows) and the runs host.json lists. Each
sample the agent takes is numbered (its chips' duty cycle), so a test says
exactly which samples landed in a run. The agent as a process is
tests/functional/test_agents.py.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from jobs.events import RunFinished, Telemetry, dumps
from tpudash.runs.backends import runs_root
from tpudash.runs.hosts import HostsReader
from tpudash.runs.layout import RUN_FILE
from tpudash.runs.liveness import WRITER_FILE, WRITERS_FOLDER
from tpudash.runs.store import Recorder, RunStore
from tpudash.runs.uploader import StoreRecorder
from tpudash.runs.workers import WorkerIdentity
from tpudash.telemetry.agent import ADOPT_AFTER_SECONDS, RUNS_SCAN_SECONDS, HostAgent, default_host_name
from tpudash.telemetry.recorder import StoreRun, StoreSamples, TelemetryRecorder

GIB = 1 << 30
INTERVAL = 1.0
# Every wait on a recorder or writer of the in-memory store (it answers at once: this bounds a failure only).
UPLOAD_WAIT = 10.0
# A session's own samples are marked with this duty cycle; the agent's count up from 1.
SESSION_MARK = 77.0


class FakeClock:
    """The agent's clock: starts at the real time (a run's start and heartbeat are real), moved by the test."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class NumberedSampler:
    """One chip whose duty cycle is the sample's number (1, 2, …), stamped by the fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.taken = 0

    def sample(self, processes: object = None) -> tuple[float, Telemetry]:
        self.taken += 1
        chips = [{"chip": 0, "duty_cycle_pct": float(self.taken), "hbm_used": GIB, "hbm_total": 16 * GIB}]
        host = {"cpu_pct": [10.0], "memory_used": GIB, "memory_total": 8 * GIB}
        return self.clock(), Telemetry(chips=chips, host=host, unavailable={})

    def close(self) -> None:
        pass


@dataclass
class Setting:
    runs_dir: Path | str
    store: RunStore
    tmp: Path

    @property
    def local(self) -> bool:
        return self.store.local


@pytest.fixture(params=["memory", "local"])
def setting(request: pytest.FixtureRequest, tmp_path: Path) -> Setting:
    if request.param == "memory":
        runs_dir: Path | str = f"memory://agent-runs-{uuid.uuid4().hex[:8]}/runs"
    else:
        runs_dir = tmp_path / "runs"
    store = RunStore(runs_dir, spill_root=tmp_path / "run-unsent")
    store.prepare()
    return Setting(runs_dir, store, tmp_path)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def agents(setting: Setting, clock: FakeClock) -> Iterator[list[HostAgent]]:
    made: list[HostAgent] = []
    yield made
    for agent in made:
        agent.close(timeout=UPLOAD_WAIT)


def an_agent(setting: Setting, clock: FakeClock, made: list[HostAgent], *, name: str | None = None) -> HostAgent:
    """This machine's agent by default: its --name is the host's name, so it records the runs on the host."""
    hostname = socket.gethostname()
    agent = HostAgent(
        setting.runs_dir,
        name if name is not None else default_host_name(hostname),
        NumberedSampler(clock),
        interval=INTERVAL,
        hostname=hostname,
        spill_root=setting.tmp / "agent-unsent",
        clock=clock,
    )
    made.append(agent)
    return agent


def start_run(setting: Setting, job: str = "train") -> tuple[str, Recorder]:
    """A run being written by this process: its writer's lock held (locally), its heartbeat in the store."""
    run_id = f"20261121-025100-{job}-{uuid.uuid4().hex[:6]}"
    recorder = setting.store.create(run_id, job, {}, {})
    if isinstance(recorder, StoreRecorder):
        assert recorder.record_uploaded.wait(UPLOAD_WAIT), "the run's record never reached the store"
    assert setting.store.info(run_id).live
    return run_id, recorder


def settle(agent: HostAgent) -> None:
    """Wait until the store has every sample the agent wrote into runs (locally each is written at once)."""
    for samples in agent.store_runs.values():
        assert samples.writer.wait_uploaded(UPLOAD_WAIT), "the agent's samples never reached the store"


def exported_samples(setting: Setting, run_id: str) -> list[float]:
    """The duty cycles of the samples ``tpudash export RUN --format json`` shows for the run, in order."""
    exported = json.loads(RunStore(setting.runs_dir, spill_root=setting.tmp / "reader").export(run_id, "json"))
    return [sample["chips"][0]["duty_cycle_pct"] for sample in exported["telemetry"]]


def listed_runs(setting: Setting) -> list[str]:
    (host,) = HostsReader(setting.runs_dir).read()
    return list(host.runs)


def ticks(agent: HostAgent, clock: FakeClock, count: int) -> None:
    for _ in range(count):
        clock.advance(INTERVAL)
        agent.tick()


def test_a_live_run_nobody_samples_gets_the_agents_samples_once_it_is_old_enough(
    setting: Setting, clock: FakeClock, agents: list[HostAgent]
) -> None:
    run_id, recorder = start_run(setting)
    agent = an_agent(setting, clock, agents)

    agent.tick()  # sample 1: the run has just started; its own session may still begin recording it
    assert listed_runs(setting) == [run_id]
    assert exported_samples(setting, run_id) == []

    clock.advance(RUNS_SCAN_SECONDS)  # the next scan, past ADOPT_AFTER_SECONDS
    assert RUNS_SCAN_SECONDS >= ADOPT_AFTER_SECONDS
    agent.tick()  # sample 2: adopted
    ticks(agent, clock, 2)  # samples 3 and 4
    settle(agent)

    assert exported_samples(setting, run_id) == [2.0, 3.0, 4.0]
    assert listed_runs(setting) == [run_id]
    recorder.record(RunFinished(status="done", summary={}, error=None, traceback=None))


def test_a_run_whose_session_records_its_telemetry_never_gets_a_second_copy(
    setting: Setting, clock: FakeClock, agents: list[HostAgent]
) -> None:
    run_id, recorder = start_run(setting)
    agent = an_agent(setting, clock, agents)
    agent.tick()  # the agent finds the run while it is young: nothing of it is taken yet

    # The run's own session starts sampling (`tpudash run`, a dashboard): its first sample lands.
    session = OwnSession(setting, run_id)
    session.record(clock())

    clock.advance(RUNS_SCAN_SECONDS)
    for _ in range(3):
        agent.tick()
        session.record(clock())
        clock.advance(RUNS_SCAN_SECONDS)  # a scan at every tick: the agent is asked each time
    session.close()
    settle(agent)

    assert exported_samples(setting, run_id) == [SESSION_MARK] * 4, "the agent added samples to a recorded run"
    assert listed_runs(setting) == [run_id], "host.json lists the run on this host whoever records it"
    recorder.record(RunFinished(status="done", summary={}, error=None, traceback=None))


class OwnSession:
    """A run's own session recording its telemetry, as ``tpudash run`` does: segments in a store, a flock'd file locally.

    Each of its samples is marked with ``SESSION_MARK``; in a store each is waited on until the store has it.
    """

    def __init__(self, setting: Setting, run_id: str) -> None:
        self.recorder = TelemetryRecorder()
        self.segments = None if setting.local else StoreSamples(StoreRun(setting.store, run_id))
        self.run_dir = setting.store.local_dir(run_id)

    def record(self, stamp: float) -> None:
        chips = [{"chip": 0, "duty_cycle_pct": SESSION_MARK, "hbm_used": GIB, "hbm_total": 16 * GIB}]
        sample = Telemetry(chips=chips, host={}, unavailable={})
        if self.segments is None:
            self.recorder.record(stamp, sample, [self.run_dir])
            return
        self.segments.write((dumps(sample, stamp) + "\n").encode())
        assert self.segments.writer.wait_uploaded(UPLOAD_WAIT), "the session's samples never reached the store"

    def close(self) -> None:
        self.recorder.close()
        if self.segments is not None:
            self.segments.close()


def write_run_of_another_host(setting: Setting, clock: FakeClock, host: str) -> str:
    """A live run written from ``host``: its record and a fresh heartbeat name it (no lock of this machine held)."""
    run_id = f"20261121-025100-train-{uuid.uuid4().hex[:6]}"
    files = runs_root(setting.runs_dir).files(run_id)
    record = {"run_id": run_id, "job": "train", "status": "running", "started": clock() - 60, "host": host, "pid": 1}
    files.write(RUN_FILE, json.dumps(record).encode())
    beat = json.dumps({"heartbeat": time.time(), "interval": 5.0, "pid": 1, "host": host, "writer": "a1b2c3"})
    # Locally the writer's heartbeat is in its lock file (left unlocked: its holder is on another machine).
    files.write(WRITER_FILE if setting.local else f"{WRITERS_FOLDER}/a1b2c3.json", beat.encode())
    assert setting.store.info(run_id).live
    return run_id


def test_a_run_of_another_host_is_left_alone(setting: Setting, clock: FakeClock, agents: list[HostAgent]) -> None:
    run_id = write_run_of_another_host(setting, clock, "another-vm")
    agent = an_agent(setting, clock, agents)

    for _ in range(3):
        agent.tick()
        clock.advance(RUNS_SCAN_SECONDS)
    settle(agent)

    assert exported_samples(setting, run_id) == []
    assert listed_runs(setting) == []


def a_non_loopback_address() -> str | None:
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family == socket.AF_INET and not entry.address.startswith("127."):
                return entry.address
    return None


@pytest.mark.parametrize(
    ("worker_host", "on_this_host"),
    [
        ("hostname", True),  # --worker-index: the worker's hostname
        ("hostname:2222", True),  # TF_CONFIG naming the hosts by name
        ("address:2222", True),  # TF_CONFIG naming them by address
        ("192.0.2.7:2222", False),  # another machine's address (a documentation-only range: never this one)
    ],
)
def test_a_run_with_a_worker_on_this_host_is_listed_but_left_to_its_chiefs_host(
    tmp_path: Path, clock: FakeClock, worker_host: str, on_this_host: bool
) -> None:
    address = a_non_loopback_address()
    if "address" in worker_host and address is None:
        pytest.skip("this machine has no address but loopback")
    worker_host = worker_host.replace("hostname", socket.gethostname()).replace("address", address or "")
    store = RunStore(f"memory://agent-runs-{uuid.uuid4().hex[:8]}/runs", spill_root=tmp_path / "run-unsent")
    setting = Setting(store.root, store, tmp_path)
    run_id = write_run_of_another_host(setting, clock, "chief-vm")
    worker = store.join(run_id, "train", {}, {}, worker=WorkerIdentity(1, 2, "worker", worker_host))
    assert worker.heartbeat.beat(), "the worker's heartbeat never reached the store"
    made: list[HostAgent] = []
    agent = an_agent(setting, clock, made)
    try:
        agent.tick()
        ticks(agent, clock, 1)
        settle(agent)

        # One telemetry stream per run: the chief's host's agent writes it, never a worker host's beside it.
        assert exported_samples(setting, run_id) == []
        assert listed_runs(setting) == ([run_id] if on_this_host else [])
    finally:
        agent.close(timeout=UPLOAD_WAIT)
        worker.close()


def test_an_agent_named_other_than_this_machine_records_no_run(
    setting: Setting, clock: FakeClock, agents: list[HostAgent]
) -> None:
    run_id, recorder = start_run(setting)
    simulated = an_agent(setting, clock, agents, name="sim-1")

    for _ in range(3):
        simulated.tick()
        clock.advance(RUNS_SCAN_SECONDS)
    settle(simulated)

    assert exported_samples(setting, run_id) == []
    assert listed_runs(setting) == [], "a simulated host lists runs it neither runs nor samples"
    recorder.record(RunFinished(status="done", summary={}, error=None, traceback=None))


def test_the_agent_stops_adding_to_a_run_within_one_scan_of_its_end(
    setting: Setting, clock: FakeClock, agents: list[HostAgent]
) -> None:
    run_id, recorder = start_run(setting)
    agent = an_agent(setting, clock, agents)
    agent.tick()
    clock.advance(RUNS_SCAN_SECONDS)
    agent.tick()  # sample 2: adopted
    settle(agent)
    assert exported_samples(setting, run_id) == [2.0]

    recorder.record(RunFinished(status="done", summary={}, error=None, traceback=None))
    if isinstance(recorder, StoreRecorder):
        assert recorder.wait_uploaded(UPLOAD_WAIT)
    taken_before_the_scan = agent.sampler.taken  # type: ignore[attr-defined]
    ticks(agent, clock, 1)  # no scan is due yet: this sample may still land
    clock.advance(RUNS_SCAN_SECONDS)
    agent.tick()  # the scan finds the run ended
    ticks(agent, clock, 3)

    landed = exported_samples(setting, run_id)
    assert landed[-1] <= taken_before_the_scan + 1, f"samples added after the scan that found the run ended: {landed}"
    assert listed_runs(setting) == []
    assert not agent.store_runs and not agent.local_runs.recording


def test_a_run_whose_record_names_no_host_is_listed_but_never_recorded_by_a_workers_host(
    tmp_path: Path, clock: FakeClock
) -> None:
    """run.json without a host (written by hand, or by an older writer): no agent can tell it is the chief's host.

    A worker of the run beats from this host, so host.json lists the run; but its one telemetry stream is the
    chief's host's agent's to write, and a run whose chief is unknown is recorded by no agent at all.
    """
    store = RunStore(f"memory://agent-runs-{uuid.uuid4().hex[:8]}/runs", spill_root=tmp_path / "run-unsent")
    setting = Setting(store.root, store, tmp_path)
    run_id = f"20261121-025100-train-{uuid.uuid4().hex[:6]}"
    files = runs_root(setting.runs_dir).files(run_id)
    record = {"run_id": run_id, "job": "train", "status": "running", "started": clock() - 60, "pid": 1}
    files.write(RUN_FILE, json.dumps(record).encode())
    chief_beat = {"heartbeat": time.time(), "interval": 5.0, "pid": 1, "writer": "c0c0c0"}
    files.write(f"{WRITERS_FOLDER}/c0c0c0.json", json.dumps(chief_beat).encode())
    assert store.info(run_id).live and store.info(run_id).host is None
    worker = store.join(run_id, "train", {}, {}, worker=WorkerIdentity(1, 2, "worker", socket.gethostname()))
    assert worker.heartbeat.beat(), "the worker's heartbeat never reached the store"
    made: list[HostAgent] = []
    agent = an_agent(setting, clock, made)
    try:
        agent.tick()  # the run is old enough at the first scan: adopted then, if ever
        ticks(agent, clock, 2)
        settle(agent)

        assert listed_runs(setting) == [run_id]
        assert exported_samples(setting, run_id) == [], "an agent recorded a run whose chief's host is unknown"
        assert not agent.store_runs
    finally:
        agent.close(timeout=UPLOAD_WAIT)
        worker.close()


def a_run_of_this_host_started_at(setting: Setting, started: float) -> str:
    """A live run in the store written from this host (its run.json says), its start a whole second (its age exact)."""
    run_id = f"20261121-025100-train-{uuid.uuid4().hex[:6]}"
    files = runs_root(setting.runs_dir).files(run_id)
    record = {"run_id": run_id, "job": "train", "status": "running", "started": started, "host": socket.gethostname()}
    files.write(RUN_FILE, json.dumps(dict(record, pid=1)).encode())
    # Its heartbeat names no host: run.json's alone says it is this one's.
    beat = {"heartbeat": time.time(), "interval": 5.0, "pid": 1, "writer": "b0b0b0"}
    files.write(f"{WRITERS_FOLDER}/b0b0b0.json", json.dumps(beat).encode())
    return run_id


@pytest.mark.parametrize("first_scan_age", [-5.0, ADOPT_AFTER_SECONDS - 0.5])
def test_a_run_is_adopted_at_the_first_scan_once_it_is_exactly_old_enough(
    tmp_path: Path, clock: FakeClock, first_scan_age: float
) -> None:
    """Scans come every RUNS_SCAN_SECONDS: at -5 s then exactly ADOPT_AFTER_SECONDS; or at 9.5 s (too young) then 24.5 s."""
    store = RunStore(f"memory://agent-runs-{uuid.uuid4().hex[:8]}/runs", spill_root=tmp_path / "run-unsent")
    setting = Setting(store.root, store, tmp_path)
    started = float(int(time.time()) - 100)
    run_id = a_run_of_this_host_started_at(setting, started)
    made: list[HostAgent] = []
    agent = an_agent(setting, clock, made)
    try:
        clock.now = started + first_scan_age
        agent.tick()  # sample 1, the first scan: too young
        assert not agent.store_runs
        clock.now += RUNS_SCAN_SECONDS
        agent.tick()  # sample 2, the second scan
        settle(agent)
        assert exported_samples(setting, run_id) == [2.0]
    finally:
        agent.close(timeout=UPLOAD_WAIT)


def test_at_most_max_runs_recorded_are_adopted_and_a_stop_lets_go_of_them(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpudash.telemetry import agent as agent_module

    monkeypatch.setattr(agent_module, "MAX_RUNS_RECORDED", 1)
    store = RunStore(f"memory://agent-runs-{uuid.uuid4().hex[:8]}/runs", spill_root=tmp_path / "run-unsent")
    setting = Setting(store.root, store, tmp_path)
    started = float(int(time.time()) - 100)
    run_ids = [a_run_of_this_host_started_at(setting, started) for _ in range(2)]
    made: list[HostAgent] = []
    agent = an_agent(setting, clock, made)
    try:
        clock.now = started + 60
        agent.tick()
        settle(agent)
        assert sorted(listed_runs(setting)) == sorted(run_ids), "host.json lists every run of the host"
        assert sorted(len(exported_samples(setting, run_id)) for run_id in run_ids) == [0, 1]
    finally:
        agent.close(timeout=UPLOAD_WAIT)
    assert not agent.store_runs and not agent.local_runs.recording


def test_a_stopped_agent_lets_go_of_a_local_runs_telemetry_for_its_session(tmp_path: Path, clock: FakeClock) -> None:
    store = RunStore(tmp_path / "runs", spill_root=tmp_path / "run-unsent")
    store.prepare()
    setting = Setting(store.root, store, tmp_path)
    run_id, recorder = start_run(setting)
    made: list[HostAgent] = []
    agent = an_agent(setting, clock, made)
    agent.tick()
    clock.advance(RUNS_SCAN_SECONDS)
    agent.tick()  # sample 2: adopted, the run's telemetry file flock'd by the agent
    assert exported_samples(setting, run_id) == [2.0]

    agent.close(timeout=UPLOAD_WAIT)
    session = OwnSession(setting, run_id)
    session.record(clock())
    session.close()

    assert exported_samples(setting, run_id) == [2.0, SESSION_MARK], "the stopped agent still holds the run's telemetry"
    recorder.record(RunFinished(status="done", summary={}, error=None, traceback=None))
