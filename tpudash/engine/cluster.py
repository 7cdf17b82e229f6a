"""A run on N workers of this machine: TF_CONFIG on loopback ports, one ``tpudash run`` per worker, one run.

TensorFlow's own multi-worker engine (``MultiWorkerMirroredStrategy``) does
the training; this module only starts its workers and watches them. Each
worker runs the very command a user runs on a real host of a cluster::

    python -m tpudash run JOB --worker-index I --cluster 127.0.0.1:P0,127.0.0.1:P1 --run-id ID --json [--set …]

so N workers on loopback and N real hosts take the identical path. Worker 0
is the chief: it writes the run (run.json and its events); the others join it
(``RunStore.join``). The chief's JSON events are relayed to the caller (the
runner's sinks: ``tpudash run``'s display, the dashboard's engine), so a run
on two workers looks like a run on one.

A worker that dies by a signal or fails ends the run at once: the launcher
sees the exit (it waits on every worker's process), names the worker, stops
the others and records the run as failed with that name. Cancel stops every
worker (SIGTERM, then SIGKILL after a grace) and the run ends cancelled.
Workers' stderr goes to ``worker-<i>.log`` in the run's local directory.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from jobs.events import Event, RunFinished, decode_event_line
from tpudash.childproc import parent_death_signal
from tpudash.runs.workers import end_unended_workers

MAX_WORKERS = 64
STOP_GRACE_SECONDS = 3.0
"""How long a worker asked to stop (SIGTERM) may take before it is killed."""
AFTER_CHIEF_SECONDS = 30.0
"""How long the other workers may take to exit once the chief has ended the run."""
STDERR_TAIL_LINES = 20
LOG_BUFFER_BYTES = 1 << 20
"""A worker's stderr kept in memory until the run's directory exists (the chief creates it)."""
WATCH_SECONDS = 0.1
"""How often the launcher looks at the run's cancel while it waits for a worker's exit."""

CLUSTER_FORM = "host:port,host:port,… (one address per worker, worker 0 first; e.g. 10.0.0.2:2222,10.0.0.3:2222)"


class ClusterFlagError(ValueError):
    """A cluster flag that cannot be used; the message names the flag and what it may be."""


def free_loopback_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now (all bound at once, so none repeats), released for the workers."""
    sockets = []
    try:
        for _ in range(count):
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(probe)
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


def cluster_addresses(text: str) -> list[str]:
    """``--cluster host:port,host:port`` as its addresses; ClusterFlagError naming ``--cluster`` and the form."""
    addresses = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in addresses):
        raise ClusterFlagError(f"--cluster: {text!r:.80} has an empty address; allowed: {CLUSTER_FORM}")
    if len(addresses) > MAX_WORKERS:
        raise ClusterFlagError(f"--cluster: {len(addresses)} addresses; allowed: 1 to {MAX_WORKERS} workers")
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ClusterFlagError(
                f"--cluster: {address!r:.80} is not host:port with a port of 1 to 65535; allowed: {CLUSTER_FORM}"
            )
        if any(char.isspace() for char in address):
            raise ClusterFlagError(f"--cluster: {address!r:.80} holds a space; allowed: {CLUSTER_FORM}")
    if len(set(addresses)) != len(addresses):
        raise ClusterFlagError(f"--cluster: an address is listed twice; allowed: {CLUSTER_FORM}")
    return addresses


def worker_index(text: str, count: int) -> int:
    """``--worker-index`` as a number in 0…count-1, or ClusterFlagError naming the flag."""
    if not text.strip().isdigit() or not 0 <= int(text) < count:
        raise ClusterFlagError(
            f"--worker-index: {text!r:.40} is not a worker of the --cluster's {count}; allowed: 0 to {count - 1}"
        )
    return int(text)


def worker_count(text: str) -> int:
    """``--workers`` as a number in 1…MAX_WORKERS, or ClusterFlagError naming the flag."""
    if not text.strip().isdigit() or not 1 <= int(text) <= MAX_WORKERS:
        raise ClusterFlagError(f"--workers: {text!r:.40} is not a count of workers; allowed: 1 to {MAX_WORKERS}")
    return int(text)


def tf_config(addresses: Sequence[str], index: int) -> str:
    """TensorFlow's TF_CONFIG for worker ``index`` of ``addresses`` (worker 0 is the chief)."""
    return json.dumps({"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}})


def describe_exit(returncode: int) -> str:
    """How a process ended, in words: ``killed by SIGKILL``, ``exited with status 1``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


LAUNCHER_VARIABLE = "TPUDASH_LAUNCHER_PID"
"""Set for every launched worker: the launcher's pid, which the worker dies with (``die_with_launcher``)."""


@dataclass
class LaunchOutcome:
    """How a launched run ended, as its RunFinished says it."""

    status: str
    error: str | None = None
    summary: dict = field(default_factory=dict)
    traceback: str | None = None
    lost_worker: int | None = None
    """The worker whose loss ended the run (None: none was lost)."""


class WorkerLog:
    """One worker's stderr: to ``path`` once its directory exists (held in memory until then), its last lines kept."""

    def __init__(self, path: Path):
        self.path = path
        self.tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._pending: list[str] = []
        self._pending_bytes = 0
        self._file: IO[str] | None = None
        self._lock = threading.Lock()

    def add(self, line: str) -> None:
        with self._lock:
            if line.strip():
                self.tail.append(line.rstrip())
            if self._file is None and self.path.parent.is_dir():
                self._open()
            if self._file is not None:
                self._file.write(line)
                self._file.flush()
            elif self._pending_bytes < LOG_BUFFER_BYTES:
                # The head of the log is what explains a worker that never got going; past the cap, the tail has the rest.
                self._pending.append(line)
                self._pending_bytes += len(line)

    def _open(self) -> None:
        self._file = open(self.path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115 - kept open while the worker writes
        self._file.writelines(self._pending)
        self._pending, self._pending_bytes = [], 0

    def close(self) -> None:
        """Write what is held (creating the directory: the run may never have been created) and close."""
        with self._lock:
            try:
                if self._file is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._open()
                if self._file is not None:
                    self._file.close()
            except OSError:
                pass  # the run's own record says how it ended; its workers' logs are a help, not the record


class ClusterLaunch:
    """Start ``count`` workers of ``job`` on this machine, relay the chief's events, watch every worker.

    ``params``: the job's params as text (``JobSpec.as_text``), passed on as ``--set``.
    ``store``: the run's ``RunStore`` (where the chief writes it; the launcher ends it when the chief could not).
    ``environment``: the workers' environment (the session's settings as TPUDASH_* variables).
    ``on_event``: called with (timestamp, event) for each of the chief's events but its RunFinished.
    ``program``: what each worker runs, before ``run JOB …`` (tpudash itself; the tests' fake worker).
    """

    def __init__(
        self,
        *,
        job: str,
        params: Mapping[str, str],
        run_id: str,
        count: int,
        store: Any,
        environment: Mapping[str, str],
        on_event: Callable[[float | None, Event], None],
        name: str | None = None,
        grace: float = STOP_GRACE_SECONDS,
        program: Sequence[str] = (sys.executable, "-m", "tpudash"),
    ):
        self.job, self.params, self.run_id, self.count = job, dict(params), run_id, count
        self.store = store
        self.environment = dict(environment)
        self.on_event = on_event
        self.name = name
        self.grace = grace
        self.program = list(program)
        self.addresses: list[str] = []
        self.processes: list[subprocess.Popen] = []
        self.logs: list[WorkerLog] = []
        self.log_dir: Path = store.local_dir(run_id)
        self._chief_finished: RunFinished | None = None
        self._readers: list[threading.Thread] = []
        self._events_reader: threading.Thread | None = None

    # -- starting --------------------------------------------------------------------------------
    def command(self, index: int) -> list[str]:
        """The command worker ``index`` runs: what a user runs on host ``index`` of a real cluster."""
        command = [*self.program, "run", self.job, "--worker-index", str(index)]
        command += ["--cluster", ",".join(self.addresses), "--run-id", self.run_id, "--json"]
        if self.name is not None:
            command += ["--name", self.name]
        for param, value in self.params.items():
            command += ["--set", f"{param}={value}"]
        return command

    def worker_label(self, index: int) -> str:
        return f"worker {index} ({self.addresses[index]})"

    def start(self) -> None:
        self.addresses = [f"127.0.0.1:{port}" for port in free_loopback_ports(self.count)]
        environment = dict(self.environment)
        environment.pop("TF_CONFIG", None)  # each worker's comes from its flags
        # The workers' stderr is their log: TensorFlow's native chatter belongs there, not in a session log.
        environment["TPUDASH_NATIVE_STDERR"] = "terminal"
        # The session that launched them samples the run's telemetry (one sampler per host, as for the engine's jobs).
        environment["TPUDASH_TELEMETRY_INTERVAL"] = "0"
        environment[LAUNCHER_VARIABLE] = str(os.getpid())  # each worker ties itself to this process (die_with_launcher)
        for index in range(self.count):
            log = WorkerLog(self.log_dir / f"worker-{index}.log")
            process = subprocess.Popen(
                self.command(index),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if index == 0 else subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=environment,
                text=True,
                errors="replace",
                # Ctrl-C at the terminal is the launcher's to handle (it stops every worker, in order).
                start_new_session=True,
            )
            self.processes.append(process)
            self.logs.append(log)
            assert process.stderr is not None
            self._read(process.stderr, log.add, f"tpudash-worker-{index}-stderr")
        chief_stdout = self.processes[0].stdout
        assert chief_stdout is not None
        self._events_reader = self._read(chief_stdout, self._relay, "tpudash-worker-0-events")

    def _read(self, stream: IO[str], handle: Callable[[str], None], name: str) -> threading.Thread:
        def read() -> None:
            with stream:
                for line in stream:
                    handle(line)

        thread = threading.Thread(target=read, name=name, daemon=True)
        thread.start()
        self._readers.append(thread)
        return thread

    def _relay(self, line: str) -> None:
        try:
            stamp, event = decode_event_line(line)
        except ValueError:
            return  # a line that is not an event (a library printing): the chief's record has everything
        if isinstance(event, RunFinished):
            self._chief_finished = event
        else:
            self.on_event(stamp, event)

    # -- watching ------------------------------------------------------------------------------------
    def run(self, cancel_event: threading.Event) -> LaunchOutcome:
        """Start the workers, wait for the run's end, stop whatever is left; how the run ended."""
        exits: queue.Queue[int] = queue.Queue()
        try:
            self.start()
            for index, process in enumerate(self.processes):
                threading.Thread(
                    target=_report_exit, args=(process, index, exits), name=f"tpudash-worker-{index}-wait", daemon=True
                ).start()
            outcome = self._watch(exits, cancel_event)
        except BaseException:
            self._stop_all(kill=True)
            raise
        finally:
            self._finish_reading()
        return self._recorded(outcome)

    def _watch(self, exits: queue.Queue[int], cancel_event: threading.Event) -> LaunchOutcome:
        running = set(range(self.count))
        stop_deadline: float | None = None
        cancelled = False
        lost: LaunchOutcome | None = None
        while running:
            if cancel_event.is_set() and not cancelled and lost is None:
                cancelled = True
                self._stop_all(kill=False)
                stop_deadline = time.monotonic() + self.grace
            if stop_deadline is not None and time.monotonic() >= stop_deadline:
                self._stop_all(kill=True)
                stop_deadline = None
            try:
                index = exits.get(timeout=WATCH_SECONDS)
            except queue.Empty:
                continue
            running.discard(index)
            returncode = self.processes[index].returncode
            if index == 0 and self._events_reader is not None:
                self._events_reader.join(timeout=self.grace)  # the chief's last line (its RunFinished) is read first
            chief_ended_run = self._chief_finished is not None and self.processes[0].returncode is not None
            # A chief that exits without the run's end is as lost as a worker that dies; once the chief has
            # ended the run, how the others exit (stopped by this launcher, perhaps) changes nothing.
            failed = not chief_ended_run and (returncode != 0 or index == 0)
            if index == 0 and chief_ended_run and not cancelled and lost is None:
                assert self._chief_finished is not None
                if self._chief_finished.status == "done":
                    # The others end with the chief; one that does not within the wait has nothing left to do.
                    stop_deadline = time.monotonic() + AFTER_CHIEF_SECONDS
                else:
                    # The chief failed: the others wait on its collectives, so they are asked to stop now.
                    self._stop_all(kill=False)
                    stop_deadline = time.monotonic() + self.grace
            elif failed and not cancelled and lost is None:
                lost = self._lost(index, returncode)
                # The others are stuck on the lost worker's collectives; the chief is ended at once so that it
                # does not record the run as cancelled, which it was not.
                self._stop_all(kill=False, chief_kill=True)
                stop_deadline = time.monotonic() + self.grace
        if lost is not None:
            return lost
        finished = self._chief_finished
        if finished is not None:
            return LaunchOutcome(finished.status, finished.error, dict(finished.summary or {}), finished.traceback)
        if cancelled:
            return LaunchOutcome("cancelled", f"cancelled: its {self.count} workers were stopped")
        return LaunchOutcome("failed", f"{self.worker_label(0)}, the chief, ended without recording the run's end")

    def _lost(self, index: int, returncode: int) -> LaunchOutcome:
        label = self.worker_label(index)
        tail = list(self.logs[index].tail)
        if returncode < 0:
            error = f"{label} was lost: {describe_exit(returncode)}"
        else:
            from tpudash.accel.nativelog import crash_reason_lines

            said, noise = crash_reason_lines(tail, 5)  # TensorFlow's start-up lines are no reason (its log keeps them)
            last = " | ".join(said) or ("only TensorFlow's start-up messages" if noise else "nothing on its stderr")
            error = f"{label} failed: {describe_exit(returncode)}; its last lines: {last}"
        error += f" (its log: {self.logs[index].path})"
        return LaunchOutcome("failed", error, traceback="\n".join(tail) or None, lost_worker=index)

    def _stop_all(self, *, kill: bool, chief_kill: bool = False) -> None:
        for index, process in enumerate(self.processes):
            if process.poll() is not None:
                continue
            try:
                process.send_signal(signal.SIGKILL if kill or (chief_kill and index == 0) else signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _finish_reading(self) -> None:
        for process in self.processes:
            try:
                process.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=self.grace)
        for reader in self._readers:
            reader.join(timeout=self.grace)  # the pipes close with the processes

    def _recorded(self, outcome: LaunchOutcome) -> LaunchOutcome:
        """End the run in the store when the chief could not (a lost worker, a killed chief); close the logs."""
        if self._chief_finished is None or outcome.lost_worker is not None:
            write_error = self.store.finish_abandoned(self.run_id, self.job, self.params, outcome.status, outcome.error)
            if write_error is not None:
                outcome.error = f"{outcome.error or outcome.status}; its end could not be recorded: {write_error}"
        if outcome.status == "cancelled":
            # A worker stopped while it waited on a chief already gone is killed before its last beat.
            try:
                end_unended_workers(self.store.files(self.run_id), "cancelled")
            except Exception:  # noqa: BLE001 - a store away: the Workers tab says "stale" for it, as it would
                pass
        for log in self.logs:
            log.close()
        return outcome


def die_with_launcher(environ: Mapping[str, str]) -> None:
    """In a launched worker, first thing: die with the launcher, so no orphan keeps training (Linux; elsewhere, nothing).

    The worker sets its own parent-death signal. Set by a ``preexec_fn`` instead, Python ran between fork
    and exec in a launcher with threads (telemetry's gRPC channel, the workers' log readers), and one
    worker start in eight died of SIGSEGV before it ran (measured: tests/cluster's bucket run, 1 of 8).
    A launcher that died before the worker got here ends it at once.
    """
    launcher = environ.get(LAUNCHER_VARIABLE, "")
    if not launcher.isdigit():
        return
    tie = parent_death_signal(signal.SIGKILL, expected_parent=int(launcher))
    if tie is not None:
        tie()


def _report_exit(process: subprocess.Popen, index: int, exits: queue.Queue[int]) -> None:
    process.wait()
    exits.put(index)
