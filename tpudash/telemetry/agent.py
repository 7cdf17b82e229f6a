"""``tpudash agent``: one per host, sampling the host and writing it into the runs directory (a bucket, usually).

libtpu's metrics service answers only on its own host (local gRPC
credentials), so telemetry from many hosts needs something on each host.
The agent samples this host every ``interval`` (libtpu's service on
``--tpu-metrics``, psutil for CPU and memory: ``tpudash.telemetry.sampling``)
and writes, with no inbound port:

- the sample into the host's stream ``hosts/<name>/samples`` (segments, by a
  ``SegmentWriter``: never blocking on the store, spilling to this host's
  disk while the store is away);
- ``hosts/<name>/host.json``, replaced at every sample: the heartbeat and
  the latest snapshot (``tpudash.runs.hosts``). A reader judges the host by
  the one staleness rule (``tpudash.runs.heartbeat``): stale once
  ``STALE_AFTER_INTERVALS`` intervals pass without one. When the agent
  stops cleanly its last host.json says ``stopped`` and carries no figures
  (a reader never shows its last CPU as current);
- the sample into the telemetry of every live run on this host that no one
  else samples (below).

Which runs the agent records (each sample lands in a run once):

- only the machine's own agent records runs: the one whose ``--name`` is
  this host's name (the default). Agents given other names on one machine
  (simulated hosts, tests) write their host streams only, and their
  host.json lists no run;
- a run is on this host when it is live and its writer is here: locally its
  writer's lock is held; in a store its run.json or one of its writers'
  heartbeats names this host (a worker's heartbeat may name it by
  TF_CONFIG's ``host:port``, by name or by one of this machine's
  addresses). host.json lists every such run, whoever records it;
- a run is adopted once it has been live ``ADOPT_AFTER_SECONDS`` and only if
  no one records its telemetry yet: in a store its ``telemetry/`` holds no
  segment (a dashboard or ``tpudash run`` on this host records its own
  engine's run from the run's start, and its first segment is up within
  ``segment_writer.SEAL_SECONDS``); locally the first to take the flock on
  ``telemetry.jsonl`` records (``TelemetryRecorder``), and the run's own
  session takes it at the start. A run found recorded by someone else is
  left alone for good. A run over several hosts (a cluster's workers) is
  recorded by the agent of its chief's host only (the host in its
  run.json): a run has one telemetry stream, and two agents' chips must
  not mix in it. The other hosts' samples of that time are in their own
  host streams, and their host.json lists the run.

Bounds (memory stays flat over days): the sampler keeps one sample of
history; each segment writer holds at most ``segment_writer.MAX_MEMORY_BYTES`` in
memory and spills the rest to disk; at most ``MAX_RUNS_RECORDED`` runs are
recorded at once; the live-runs scan runs once every ``RUNS_SCAN_SECONDS``,
reads the newest ``MAX_RUNS_SCANNED`` runs only, and its cache of run
records is dropped every ``STORE_RENEW_SECONDS``. On SIGTERM or SIGINT the
agent writes its stopped host.json and closes every writer within
``STOP_WAIT_SECONDS`` (what the store did not take by then stays in this
host's spill directory) and exits 0.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import psutil

from jobs.events import Telemetry, dumps, is_finite_number
from tpudash.runs import heartbeat, liveness
from tpudash.runs.backends import LocalRunFiles, RunFiles, runs_root
from tpudash.runs.hosts import (
    HOST_FILE,
    HOST_INTERVAL_SECONDS,
    HOST_NAME_RULE,
    MAX_CHIPS,
    MAX_RUNS,
    MAX_TEXT_CHARS,
    SAMPLES_STREAM,
    ChipStatus,
    HostStatus,
    host_prefix,
    host_record,
    is_host_name,
)
from tpudash.runs.layout import MAX_RUN_FILE_BYTES, STATUS_RUNNING, TELEMETRY_STREAM
from tpudash.runs.store import RunInfo, RunStore
from tpudash.runs.uploader import SegmentWriter, default_spill_dir, describe, say_on_stderr
from tpudash.telemetry.recorder import StoreRun, StoreSamples, TelemetryRecorder

RUNS_SCAN_SECONDS = 15.0
ADOPT_AFTER_SECONDS = 10.0
MAX_RUNS_SCANNED = 200
MAX_RUNS_RECORDED = 32
STORE_RENEW_SECONDS = 3600.0
STOP_WAIT_SECONDS = 5.0
# The host's stream is read for history, not followed live (host.json is the live view): fewer, larger segments.
SAMPLES_SEAL_SECONDS = 10.0
# A writer's heartbeats read per live run, to find the ones on this host.
MAX_WRITERS_ASKED = 16
INTERVAL_RANGE = (0.1, 600.0)
INTERVAL_RULE = f"seconds from {INTERVAL_RANGE[0]:g} to {INTERVAL_RANGE[1]:g}"


class Sampler(Protocol):
    """What the agent needs of ``TelemetrySampler``: one sample on request."""

    def sample(self, processes: Mapping[str, int] | None = None) -> tuple[float, Telemetry]: ...

    def close(self) -> None: ...


def default_host_name(hostname: str | None = None) -> str:
    """This host's name, as a host name in the store may be spelled (see ``hosts.HOST_NAME_RULE``)."""
    plain = re.sub(r"[^A-Za-z0-9_.-]", "_", hostname if hostname is not None else socket.gethostname())
    return plain.lstrip(".-")[:64] or "host"


def check_host_name(text: str) -> str:
    """``--name``'s value when it may name a host; ValueError saying what is allowed."""
    if not is_host_name(text):
        raise ValueError(f"{text!r:.80} is not allowed; allowed: {HOST_NAME_RULE}")
    return text


def check_interval(text: str | float) -> float:
    """``--interval``'s value in seconds; ValueError saying what is allowed."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{text!r:.40} is not a number; allowed: {INTERVAL_RULE}") from None
    if not is_finite_number(value) or not INTERVAL_RANGE[0] <= value <= INTERVAL_RANGE[1]:
        raise ValueError(f"{text!r:.40} is out of range; allowed: {INTERVAL_RULE}")
    return value


def stopped_snapshot(last: HostStatus, stamp: float) -> HostStatus:
    """The host as its agent's last host.json says it on a clean stop: stopped, its chips without a current figure."""
    return replace(
        last,
        heartbeat=stamp,
        cpu_percent=None,
        memory_used=None,
        chips=tuple(replace(chip, duty_cycle=None, hbm_used=None) for chip in last.chips),
        runs=(),
        problem=None,
        stopped=True,
    )


def snapshot(name: str, hostname: str, stamp: float, interval: float, sample: Telemetry, runs: list[str]) -> HostStatus:
    """The host as host.json says it: a sample's figures, checked as a reader will check them."""
    chips = []
    for chip in sample.chips[:MAX_CHIPS]:
        index = chip.get("chip")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            continue
        duty = chip.get("duty_cycle_pct")
        chips.append(
            ChipStatus(
                index=index,
                duty_cycle=min(100.0, max(0.0, float(duty))) if is_finite_number(duty) else None,
                hbm_used=_bytes(chip.get("hbm_used")),
                hbm_total=_bytes(chip.get("hbm_total")),
            )
        )
    cores = [value for value in sample.host.get("cpu_pct") or [] if is_finite_number(value)]
    problem = sample.unavailable.get("tpu")

    return HostStatus(
        name=name,
        hostname=hostname[:MAX_TEXT_CHARS] or name,
        heartbeat=stamp,
        interval=interval,
        cpu_percent=min(100.0, max(0.0, sum(cores) / len(cores))) if cores else None,
        memory_used=_bytes(sample.host.get("memory_used")),
        memory_total=_bytes(sample.host.get("memory_total")),
        chips=tuple(chips),
        runs=tuple(runs[:MAX_RUNS]),
        problem=problem[:MAX_TEXT_CHARS] if problem else None,
        pid=os.getpid(),
    )


def host_of(address: str) -> str:
    """A worker's host as its heartbeat names it, without TF_CONFIG's port: ``10.0.0.3:2222`` -> ``10.0.0.3``."""
    if address.startswith("["):  # [v6 address]:port
        return address[1:].partition("]")[0]
    return address.rpartition(":")[0] if address.count(":") == 1 else address


def this_machines_addresses() -> set[str]:
    """This machine's own network addresses, loopback ones left out (every machine has those)."""
    addresses: set[str] = set()
    try:
        interfaces = psutil.net_if_addrs()
    except (OSError, psutil.Error):
        return addresses
    for entries in interfaces.values():
        for entry in entries:
            try:
                address = ipaddress.ip_address(entry.address.partition("%")[0])
            except ValueError:
                continue  # a link-layer address
            if not address.is_loopback:
                addresses.add(str(address))
    return addresses


def _bytes(value: object) -> int | None:
    return int(value) if is_finite_number(value) and value >= 0 else None


class LiveRunsOnHost:
    """The live runs whose writer is on this host, found by a bounded scan of the newest runs; see the module docstring."""

    def __init__(self, runs_dir: Path | str, hostname: str, *, spill_root: Path | None, clock: Callable[[], float]):
        self.runs_dir = runs_dir
        self.hostname = hostname
        self.spill_root = spill_root
        self.clock = clock
        self.store = RunStore(runs_dir, spill_root=spill_root)
        self._store_since = clock()
        # A worker's heartbeat names its TF_CONFIG address ("10.0.0.3:2222"), not always its hostname.
        self.addresses = this_machines_addresses() if hostname == socket.gethostname() else set()

    def scan(self) -> list[RunInfo]:
        """The live runs on this host, newest last; raises what the store raises when it cannot be asked."""
        if self.clock() - self._store_since >= STORE_RENEW_SECONDS:
            # Its caches keep every run read: a fresh one keeps them to the runs of the last hour.
            self.store = RunStore(self.runs_dir, spill_root=self.spill_root)
            self._store_since = self.clock()
        store = self.store
        run_ids = store.run_ids()[-MAX_RUNS_SCANNED:]
        prefetched = {} if store.local else store.backend.read_many(run_ids, "run.json", MAX_RUN_FILE_BYTES)
        found = []
        for run_id in run_ids:
            try:
                info = store.info(run_id, prefetched.get(run_id))
            except Exception:  # noqa: BLE001 - one unreadable run never stops the scan of the others
                continue
            if info.status == STATUS_RUNNING and info.live and self._writes_here(info):
                found.append(info)
        return found

    def _writes_here(self, info: RunInfo) -> bool:
        files = info.files or self.store.files(info.run_id)
        if files.local_dir is not None:
            return bool(liveness.lock_held(files.local_dir))  # a lock is seen only by processes of this host
        if info.host == self.hostname:
            return True
        return any(self._is_here(host) for host in self._writer_hosts(files))

    def is_chiefs_host(self, info: RunInfo) -> bool:
        """Whether this host writes the run's run.json (its chief, or its only writer)."""
        return info.host is not None and self._is_here(info.host)

    def _writer_hosts(self, files: RunFiles) -> list[str]:
        """The hosts of a run's writers that beat recently (a worker of a run whose chief is elsewhere)."""
        hosts = []
        # Newest first: the heartbeats its writers keep replacing come before whatever else sits there.
        for name in heartbeat.listed_newest_first(files, liveness.WRITERS_FOLDER)[:MAX_WRITERS_ASKED]:
            try:
                data = files.read(f"{liveness.WRITERS_FOLDER}/{name}", liveness.MAX_HEARTBEAT_BYTES)
            except OSError:
                continue
            beat = heartbeat.parse_beat(data)
            if beat is not None and liveness.beat_is_fresh(data) and isinstance(beat.get("host"), str):
                hosts.append(beat["host"])
        return hosts

    def _is_here(self, address: str) -> bool:
        """Whether a writer's host (a hostname or TF_CONFIG's ``host:port``) is this machine."""
        host = host_of(address).lower()
        mine = self.hostname.lower()
        if host == mine or host in self.addresses:
            return True
        try:
            ipaddress.ip_address(host)
        except ValueError:
            # A short name and its fully qualified one ("vm-1", "vm-1.zone.internal") name one machine.
            return host.split(".")[0] == mine.split(".")[0]
        return False  # another machine's address


class HostAgent:
    """Samples this host every ``interval`` and writes it into ``runs_dir``; see the module docstring.

    ``tick`` takes and writes one sample (the benchmark drives it with a
    fake clock); ``run`` ticks on a schedule until its stop event is set;
    ``close`` ends every writer within a bounded time.
    """

    def __init__(
        self,
        runs_dir: Path | str,
        name: str,
        sampler: Sampler,
        *,
        interval: float = HOST_INTERVAL_SECONDS,
        hostname: str | None = None,
        records_runs: bool | None = None,
        spill_root: Path | None = None,
        clock: Callable[[], float] = time.time,
        notify: Callable[[str], None] = say_on_stderr,
    ) -> None:
        self.name = check_host_name(name)
        self.interval = interval
        self.hostname = hostname if hostname is not None else socket.gethostname()
        self.sampler = sampler
        self.clock = clock
        self.notify = notify
        self.spill_root = spill_root or default_spill_dir()
        self.records_runs = records_runs if records_runs is not None else name == default_host_name(self.hostname)
        """Whether this agent records live runs' telemetry: only the machine's own agent does (see the docstring)."""
        self.root = runs_root(runs_dir)
        self.root.prepare()
        self.files = self.root.files(host_prefix(name))
        self.samples = SegmentWriter(
            self.files,
            LocalRunFiles(self.spill_root / host_prefix(name)),
            stream=SAMPLES_STREAM,
            seal_seconds=SAMPLES_SEAL_SECONDS,
            notify=notify,
        )
        self.runs = LiveRunsOnHost(runs_dir, self.hostname, spill_root=spill_root, clock=clock)
        self.local_runs = TelemetryRecorder()
        self.store_runs: dict[str, StoreSamples] = {}
        self.left_alone: set[str] = set()
        """Runs someone else records: never adopted, for as long as they are live."""
        self.local_adopted: list[str] = []
        """Local runs live long enough to adopt: ``TelemetryRecorder``'s flock decides at every sample who records."""
        self.live_runs: list[str] = []
        self.last_status: HostStatus | None = None
        """What the last host.json written said (its stopped one is made from it)."""
        self.stopping = False
        """Set by ``close``: no tick writes host.json after the stopped one."""
        self._next_scan = 0.0
        self.ticks = 0
        self.last_error: str | None = None
        self._said_error = False
        self._host_file_refused = False

    # -- one sample ---------------------------------------------------------------------------
    def tick(self) -> None:
        """Sample the host; write the sample, host.json and the telemetry of the runs it records."""
        stamp, sample = self.sampler.sample()
        if self.records_runs and self.clock() >= self._next_scan:  # a simulated host has no runs of its own
            self._next_scan = self.clock() + RUNS_SCAN_SECONDS
            self._scan_runs()
        line = dumps(sample, stamp) + "\n"
        self.samples.write(line)
        self._record_runs(line, stamp, sample)
        status = snapshot(self.name, self.hostname, self.clock(), self.interval, sample, self.live_runs)
        if self.stopping:
            return  # a tick that outlived the stop: the stopped host.json is the last word
        try:
            self.files.write(HOST_FILE, host_record(status))
        except Exception as error:  # noqa: BLE001 - each store's client raises its own types when unreachable
            self._host_file_refused = True
            self._failed(f"{self.files.where}/{HOST_FILE}: {describe(error)}")
        else:
            self.last_status = status
            if self._host_file_refused:  # only then: a failed sample or listing was no refusal of the store's
                self.notify(f"{self.files.where}: the store takes host.json again")
            self.last_error, self._said_error, self._host_file_refused = None, False, False
        self.ticks += 1

    def _failed(self, line: str) -> None:
        self.last_error = line
        if not self._said_error:
            self._said_error = True
            self.notify(f"{line} (the agent goes on sampling; its samples wait on this host's disk)")

    def _scan_runs(self) -> None:
        try:
            live = self.runs.scan()
        except Exception as error:  # noqa: BLE001 - the store is away: the runs stay as they were
            self._failed(f"{self.runs.store.where}: cannot list the runs: {describe(error)}")
            return
        self.live_runs = [info.run_id for info in live][-MAX_RUNS:]
        live_ids = set(self.live_runs)
        self.left_alone &= live_ids
        for run_id in [run_id for run_id in self.store_runs if run_id not in live_ids]:
            self.store_runs.pop(run_id).close()
        # Old enough only: the run's own session takes the flock at its start, before the agent may.
        old_enough = [
            info for info in live if info.started is not None and self.clock() - info.started >= ADOPT_AFTER_SECONDS
        ]
        if self.runs.store.local:
            self.local_adopted = [info.run_id for info in old_enough][:MAX_RUNS_RECORDED]
            return
        for info in old_enough:
            if not self.runs.is_chiefs_host(info):
                # A run over several hosts has one telemetry stream: the chief's host's agent writes it, so two
                # agents never mix their chips in it. This host's own samples are in its host stream meanwhile.
                continue
            if (
                info.run_id in self.store_runs
                or info.run_id in self.left_alone
                or len(self.store_runs) >= MAX_RUNS_RECORDED
            ):
                continue
            files = self.runs.store.files(info.run_id)
            try:
                recorded = bool(files.list(TELEMETRY_STREAM))
            except Exception:  # noqa: BLE001 - asked again at the next scan
                continue
            if recorded:
                self.left_alone.add(info.run_id)
            else:
                self.store_runs[info.run_id] = StoreSamples(StoreRun(self.runs.store, info.run_id))

    def _record_runs(self, line: str, stamp: float, sample: Telemetry) -> None:
        for samples in self.store_runs.values():
            samples.write(line.encode())
        if self.records_runs and self.runs.store.local:
            adopted = [self.runs.store.local_dir(run_id) for run_id in self.local_adopted]
            self.local_runs.record(stamp, sample, adopted)

    # -- the schedule -------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Tick every ``interval`` (fixed deadlines, as ``SamplingLoop``) until ``stop`` is set; sets it on the way out."""
        deadline = time.monotonic()
        try:
            while not stop.is_set():
                try:
                    self.tick()
                except Exception as error:  # noqa: BLE001 - an agent never stops sampling without a word
                    self._failed(f"sampling failed: {describe(error)}")
                deadline += self.interval
                now = time.monotonic()
                if deadline <= now:  # a slow tick (a store that hangs): the next a whole interval on, never a burst
                    deadline = now + self.interval
                stop.wait(deadline - now)
        finally:
            stop.set()

    def _say_stopped(self) -> threading.Event:
        """Write the stopped host.json on a thread of its own (a store may hang); the event is set once it is done."""
        done = threading.Event()
        last = self.last_status
        if last is None:  # nothing was ever reported: nothing to say stopped
            done.set()
            return done

        def write() -> None:
            try:
                self.files.write(HOST_FILE, host_record(stopped_snapshot(last, self.clock())))
            except Exception as error:  # noqa: BLE001 - readers will find the host stale instead
                self._failed(f"{self.files.where}/{HOST_FILE}: {describe(error)}")
            finally:
                done.set()

        threading.Thread(target=write, name=f"tpudash-agent-stopped-{self.name}", daemon=True).start()
        return done

    def close(self, timeout: float = STOP_WAIT_SECONDS) -> bool:
        """Close every writer within ``timeout`` in all; whether the store took everything (the rest stays on disk)."""
        deadline = time.monotonic() + timeout
        self.stopping = True
        said_stopped = self._say_stopped()
        writers = [self.samples, *(samples.writer for samples in self.store_runs.values())]
        for writer in writers:
            writer.seal_now()  # every upload under way at once, within one deadline
        said_stopped.wait(max(0.0, deadline - time.monotonic()))
        complete = True
        for writer in writers:
            if not writer.finish(deadline):
                writer.keep_rest()  # on this host's disk: `tpudash copy` uploads it later
                complete = False
        self.store_runs.clear()
        self.local_runs.close()
        try:
            self.sampler.close()
        except Exception:  # noqa: BLE001 - a sampler's own channel failing to close changes nothing written
            pass
        return complete


def run_agent(agent: HostAgent, stop: threading.Event, timeout: float = STOP_WAIT_SECONDS) -> bool:
    """Tick on a thread of its own until ``stop``; then close within ``timeout``. Whether the store took it all.

    The ticks are off the caller's thread so a store call that hangs never
    holds up a stop: the caller (the main thread, where signals land) only waits.
    """
    ticking = threading.Thread(target=agent.run, args=(stop,), name=f"tpudash-agent-{agent.name}", daemon=True)
    ticking.start()
    stop.wait()
    ticking.join(timeout / 2)
    complete = agent.close(timeout / 2)
    if not complete:
        print(
            f"tpudash: agent {agent.name}: the store did not take every sample within {timeout:g} s; "
            f"the rest is kept in {agent.spill_root}",
            file=sys.stderr,
        )
    return complete
