"""The runs directory: create runs, list them (with a cache of ended runs), find, load and export one.

Reading never trusts the files: a truncated line, a malformed run.json or an
unknown event is reported as a problem and the rest is still shown. A run
left ``running`` by a process that no longer exists is reported as
``interrupted``. The file layout is ``tpudash.runs.layout``; writing one run
is ``tpudash.runs.recorder``; reading a growing file is ``tpudash.runs.tail``.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.events import Event, Metric, RunFinished, RunStarted
from tpudash.runs import liveness
from tpudash.runs.backends import LocalRoot, LocalRunFiles, RunFiles, runs_root
from tpudash.runs.export import export_run
from tpudash.runs.layout import (
    EVENTS_FILE,
    EVENTS_STREAM,
    MAX_RUN_FILE_BYTES,
    RUN_FILE,
    RUN_ID_RULE,
    SOURCE_JOB,
    STATUS_INTERRUPTED,
    STATUS_RUNNING,
    STATUS_STALE,
    TELEMETRY_STREAM,
    RefusedFile,
    checked_run_id,
    is_run_id,
    parse_run_file,
    readable_run_name,
)
from tpudash.runs.record_fields import bounded_dict, checked_field
from tpudash.runs.recorder import RunRecorder
from tpudash.runs.segments import StreamTail
from tpudash.runs.tail import fold_events, read_events
from tpudash.runs.uploader import StoreRecorder, local_run_dir
from tpudash.runs.worker_recorder import JoinedRecorder
from tpudash.runs.workers import WorkerIdentity

Recorder = RunRecorder | StoreRecorder | JoinedRecorder


@dataclass
class RunInfo:
    """What the History screen and ``tpudash runs`` show of one run."""

    run_id: str
    path: str
    """Where the run is: its directory, or its URL in a store."""
    job: str = "?"
    name: str = ""
    """What the user reads to tell runs apart (``train mnist mnist-cnn``, or the ``--name`` given): ``layout.readable_run_name``."""
    status: str = "unknown"
    started: float | None = None
    finished: float | None = None
    params: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    final_metrics: dict = field(default_factory=dict)
    error: str | None = None
    problems: list[str] = field(default_factory=list)
    source: str = SOURCE_JOB
    """Who wrote it: ``job``, ``keras-callback`` or ``record`` (see SOURCE_*)."""
    pid: int | None = None
    pid_start_time: float | None = None
    """When the writing process started (unix time): tells it from a later process given the same pid."""
    pid_start_ticks: str | None = None
    """The same, as runs written by older versions stored it (``pid_start``: clock ticks since boot)."""
    host: str | None = None
    workers: int | None = None
    """How many workers of a training cluster write the run (its chief wrote run.json); None: one writer."""
    live: bool = False
    """Running, and its writer is alive (its lock on this host, its heartbeat in a store): the run is still growing."""
    files: RunFiles | None = field(default=None, repr=False, compare=False)

    def writer_alive(self) -> bool | None:
        """Whether the run's writer is still writing it (None: it cannot be told, such as an old run of another host).

        In a store, its writers' heartbeats (``liveness.store_writers_alive``;
        None when the store cannot be asked). Locally, its lock on this host,
        its heartbeat from another (``liveness.writer_alive``); runs written
        before the lock existed are judged by their pid on this host.
        """
        if self.files is not None and not isinstance(self.files, LocalRunFiles):
            try:
                return liveness.store_writers_alive(self.files, problems=self.problems)
            except Exception:  # noqa: BLE001 - the store is unreachable: nothing can be told
                return None
        on_this_host = self.host is not None and self.host == socket.gethostname()
        judged = liveness.writer_alive(Path(self.path), on_this_host, problems=self.problems)
        if judged is not None or not on_this_host:
            return judged
        return isinstance(self.pid, int) and liveness.process_alive(
            self.pid, self.pid_start_time, start_ticks=self.pid_start_ticks
        )

    @property
    def duration(self) -> float | None:
        if self.started is None or self.finished is None:
            return None
        return max(0.0, self.finished - self.started)

    def to_dict(self) -> dict:
        return {
            "run_id": self.run_id,
            "path": self.path,
            "job": self.job,
            "name": self.name,
            "status": self.status,
            "started": self.started,
            "finished": self.finished,
            "duration": self.duration,
            "params": self.params,
            "summary": self.summary,
            "final_metrics": self.final_metrics,
            "error": self.error,
            "problems": self.problems,
            "source": self.source,
            "pid": self.pid,
            "host": self.host,
            "workers": self.workers,
            "live": self.live,
        }


def _as_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def run_id_of(run: str | Path) -> str:
    """The run id in a run's location (its directory or URL), or the id itself."""
    return str(run).rstrip("/").rsplit("/", 1)[-1]


@dataclass
class RunData:
    """A run read back: its info, the events that parsed, and what did not."""

    info: RunInfo
    events: list[tuple[float | None, Event]]
    problems: list[str]
    telemetry: list[tuple[float | None, Event]] = field(default_factory=list)
    """The accelerator and host samples observers took while the run was live (telemetry.jsonl)."""

    def metrics(self) -> list[tuple[float | None, Metric]]:
        return [(stamp, event) for stamp, event in self.events if isinstance(event, Metric)]


class RunStore:
    """The runs directory (a local directory or a store URL): create runs, list them, load and export one.

    ``root`` is a local directory (a Path) or a store's URL (``gs://bucket/runs``, see
    ``tpudash.runs.location``); ``spill_root`` is where a store's writers keep what the
    store has not taken yet (``uploader.default_spill_dir`` by default).
    """

    def __init__(self, root: Path | str, *, spill_root: Path | None = None):
        self.backend = runs_root(root)
        self.root: Path | str = self.backend.path if isinstance(self.backend, LocalRoot) else self.backend.url
        self.where = self.backend.where
        """The runs directory as a user reads it."""
        self.local = self.backend.local
        self.spill_root = spill_root
        self._recorded: dict[str, tuple[tuple | None, RunInfo]] = {}
        """run.json as read, by run id, with the key (mtime and size, generation, ETag) it was read at."""
        self._ended: dict[str, tuple[tuple | None, RunInfo]] = {}
        """Runs judged ended: History lists the runs every second, and thousands of old ones must cost nothing."""

    def files(self, run_id: str) -> RunFiles:
        return self.backend.files(run_id)

    def location(self, run_id: str) -> str:
        """Where a run is, as a user reads it: its directory or its URL."""
        return self.files(run_id).where

    def local_dir(self, run_id: str) -> Path:
        """Where this host writes a run's files: its directory, or for a store run its local directory
        (``uploader.local_run_dir``: telemetry and TensorBoard logs there go up at the run's finish)."""
        files = self.files(run_id)
        return files.run_dir if isinstance(files, LocalRunFiles) else local_run_dir(self.spill_root, run_id)

    def stream(self, run_id: str, stream: str = EVENTS_STREAM, *, follow: bool = False) -> StreamTail:
        """A reader of a run's events (or ``telemetry``) in either layout (``segments.StreamTail``).

        ``follow``: for a reader polled from a UI's thread (the dashboard's lane, a run view): in a
        store its requests are made on a thread of its own, so a poll never waits for the network.
        """
        return StreamTail(self.files(run_id), stream, appends=self.local, prefetch=follow and not self.local)

    def prepare(self) -> None:
        """Create the runs directory if it is local (a store's prefix needs nothing)."""
        self.backend.prepare()

    def create(
        self,
        run_id: str,
        job: str,
        params: dict,
        runtime: dict,
        *,
        source: str = SOURCE_JOB,
        flush_interval: float = 0.0,
        name: str | None = None,
        worker: WorkerIdentity | None = None,
    ) -> Recorder:
        """A new run and its recorder (``flush_interval``: see ``RunRecorder``; a store's recorder always buffers).

        ``name``: what the user called the run; by default one made from the job and its params.
        ``worker``: the chief of a training cluster (``workers.find_worker``): run.json then says how many
        workers write the run, and the chief's heartbeat carries its step stats as every worker's does.
        The other workers ``join`` the run; one of them may have begun before the chief, so the run's
        directory may exist already, but a run.json there is another run's (FileExistsError).
        """
        meta = {
            "source": source,
            "run_id": checked_run_id(run_id),
            "job": job,
            "name": name or readable_run_name(job, params),
            "params": params,
            "runtime": runtime,
            "status": STATUS_RUNNING,
            "started": time.time(),
            "finished": None,
            "pid": os.getpid(),
            "pid_start_time": liveness.process_start_time(os.getpid()),
            "host": socket.gethostname(),
        }
        if worker is not None:
            if not worker.is_chief:
                raise ValueError(
                    f"worker: {worker.index} is not the chief (0); the chief creates the run, others join it"
                )
            meta["workers"] = {"count": worker.count}
            if self.files(run_id).key(RUN_FILE) is not None:
                raise FileExistsError(f"run {run_id} exists already in {self.where}; give each run its own id")
        return self._recorder(run_id, meta, new=True, flush_interval=flush_interval, worker=worker)

    def join(self, run_id: str, job: str, params: dict, runtime: dict, *, worker: WorkerIdentity) -> JoinedRecorder:
        """A non-chief worker's recorder of the run its chief creates (``worker_recorder.JoinedRecorder``).

        It never writes run.json; its events go to the stream ``worker-<index>`` and its heartbeat to
        ``writers/``, locally as in a store. ``job``, ``params`` and ``runtime`` go into its own RunStarted.
        """
        if worker.is_chief:
            raise ValueError("worker: the chief (0) creates the run with create(); the other workers join it")
        meta = {
            "run_id": checked_run_id(run_id),
            "job": job,
            "params": params,
            "runtime": runtime,
            "worker": worker.index,
        }
        return JoinedRecorder(self.files(run_id), meta, worker=worker, spill_root=self.spill_root)

    def _recorder(
        self,
        run_id: str,
        meta: dict,
        *,
        new: bool = False,
        flush_interval: float = 0.0,
        worker: WorkerIdentity | None = None,
    ) -> Recorder:
        files = self.files(run_id)
        if isinstance(files, LocalRunFiles):
            if new:
                # A cluster's other workers may have made the directory first (their streams).
                files.run_dir.mkdir(parents=True, exist_ok=worker is not None)
            return RunRecorder(files.run_dir, meta, flush_interval=flush_interval, worker=worker)
        return StoreRecorder(files, meta, spill_root=self.spill_root, worker=worker)

    def finish_abandoned(self, run_id: str, job: str, params: dict, status: str, error: str | None) -> OSError | None:
        """End a run whose writer died (a killed engine): record RunFinished and update run.json.

        Everything the run reported stays; its final metrics are read back
        from its events. Locally RunFinished starts on a line of its own,
        after a last line the writer left cut short (that line reads as one
        event that could not be read); in a store it is a segment of its own.
        A run the writer never created is created here, so even a job that
        died before it started has a record. A run that already ended is left
        as it is. Returns the error that kept the end from being written (a
        full disk, a store away), or None; it never raises one.
        """
        latest: dict[str, Metric] = {}  # per metric, its last point: what run.json's final_metrics keeps
        ended, events_seen = False, 0

        def visit(stamp: float | None, event: Event) -> None:
            nonlocal ended, events_seen
            events_seen += 1
            ended = ended or isinstance(event, RunFinished)
            if isinstance(event, Metric):
                latest[event.final_name] = event

        fold_events(self.stream(run_id), visit)  # in bounded memory, whatever the run holds
        if ended:
            return None
        try:
            # A regular file only, capped: never a FIFO that would block the lane.
            meta = parse_run_file(self.files(run_id).read(RUN_FILE, MAX_RUN_FILE_BYTES))
        except (OSError, ValueError):
            meta = None
        try:
            return self._write_finish(run_id, job, params, status, error, events_seen, list(latest.values()), meta)
        except OSError as write_error:
            return write_error

    def _write_finish(
        self,
        run_id: str,
        job: str,
        params: dict,
        status: str,
        error: str | None,
        events_seen: int,
        metrics: list[Metric],
        meta: Any,
    ) -> OSError | None:
        if not isinstance(meta, dict):
            if self.files(run_id).exists():
                recorder = self._recorder(
                    run_id,
                    {
                        "run_id": run_id,
                        "job": job,
                        "params": params,
                        "status": STATUS_RUNNING,
                        "started": time.time(),
                        "host": socket.gethostname(),
                    },
                )
            else:
                recorder = self.create(run_id, job, params, {})
            if not events_seen:
                recorder.record(RunStarted(run_id, job, params, {}, time.time()))
        else:
            recorder = self._recorder(run_id, meta)
        for metric in metrics:
            recorder.remember_metric(metric)
        recorder.record(RunFinished(status=status, summary={}, error=error, traceback=None))
        return recorder.write_error

    def run_ids(self) -> list[str]:
        """Every run's id, by name (locally a symbolic link to a directory is listed; ``info`` says it is not read)."""
        return self.backend.run_ids()

    def record_key(self, files: RunFiles) -> tuple | None:
        """What changes when a run's record changes: run.json's (else the appended events') key."""
        return files.key(RUN_FILE) or files.key(EVENTS_FILE)

    def info(self, run: str | Path, prefetched: bytes | Exception | None = None) -> RunInfo:
        """One run's record (``run`` is its id or location), falling back to its events when run.json is unusable.

        Ended runs are read once: locally while run.json's mtime and size stay
        the same, in a store for good (only a run's writer replaces its
        run.json, and an ended run's writer is done). A running run's
        run.json is read again only when its key changes (its generation or
        ETag in a store); its writer's liveness is judged at every call.
        ``prefetched``: run.json's bytes (or the error reading them), from a
        batch read of many runs.
        """
        run_id = run_id_of(run)
        files = self.files(run_id)
        ended = self._ended.get(run_id)
        if ended is not None and (not self.local or ended[0] == self.record_key(files)):
            return _copy(ended[1])
        key = None if prefetched is not None else self.record_key(files)
        recorded = self._recorded.get(run_id)
        if recorded is None or key is None or recorded[0] != key:
            recorded = (key, self._read_record(run_id, files, prefetched))
            self._recorded[run_id] = recorded
        info = self._judged(_copy(recorded[1]))
        # A stale run may come back (its writer was cut off from the store): it is judged again each time.
        if info.status not in (STATUS_RUNNING, STATUS_STALE) and (key is not None or not self.local):
            self._ended[run_id] = (key, info)
            self._recorded.pop(run_id, None)
        return _copy(info)

    def _read_record(self, run_id: str, files: RunFiles, prefetched: bytes | Exception | None) -> RunInfo:
        """run.json read with every field checked: a field that breaks its rule is left out and named."""
        info = RunInfo(run_id=run_id, path=files.where, files=files)
        if isinstance(files, LocalRunFiles) and files.run_dir.is_symlink():
            info.problems.append(f"{run_id}: a symbolic link, not followed")
            return info
        meta: Any = None
        try:
            if isinstance(prefetched, Exception):
                raise prefetched
            data = prefetched if prefetched is not None else files.read(RUN_FILE, MAX_RUN_FILE_BYTES)
            meta = parse_run_file(data)
            if not isinstance(meta, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            info.problems.append(f"{RUN_FILE}: missing")
            meta = None
        except RefusedFile as error:
            info.problems.append(str(error))
            meta = None
        except (OSError, ValueError) as error:
            info.problems.append(f"{RUN_FILE}: unreadable ({getattr(error, 'strerror', None) or error})")
            meta = None
        if meta is None:
            self._info_from_events(info)
            return info
        problems = info.problems
        info.job = checked_field(meta, "job", problems) or "?"
        info.name = checked_field(meta, "name", problems) or ""
        info.status = checked_field(meta, "status", problems) or "unknown"
        info.started = _as_float(checked_field(meta, "started", problems))
        info.finished = _as_float(checked_field(meta, "finished", problems))
        info.params = checked_field(meta, "params", problems) or {}
        info.summary = checked_field(meta, "summary", problems) or {}
        final_metrics = checked_field(meta, "final_metrics", problems) or {}
        info.final_metrics = {name: value for name, value in final_metrics.items() if _is_number(value)}
        info.error = checked_field(meta, "error", problems)
        info.source = checked_field(meta, "source", problems) or SOURCE_JOB
        info.pid = checked_field(meta, "pid", problems)
        info.pid_start_time = _as_float(checked_field(meta, "pid_start_time", problems))
        info.pid_start_ticks = checked_field(meta, "pid_start", problems)
        info.host = checked_field(meta, "host", problems)
        workers = checked_field(meta, "workers", problems)
        info.workers = workers["count"] if workers is not None else None
        info.name = info.name or readable_run_name(info.job, info.params)
        return info

    def _judged(self, info: RunInfo) -> RunInfo:
        """A run recorded as running, judged by its writer: live, interrupted (its writer is gone) or stale."""
        if info.status != STATUS_RUNNING:
            return info
        alive = info.writer_alive()
        if alive is False:
            if self.local:
                info.status = STATUS_INTERRUPTED
                self._refresh_from_events(info)
            else:
                # Its writers stopped beating: dead, or cut off from the store (then it comes back).
                info.status = STATUS_STALE
        info.live = bool(alive)
        return info

    def _info_from_events(self, info: RunInfo) -> None:
        info.status = STATUS_INTERRUPTED

        def visit(stamp: float | None, event: Event) -> None:
            if isinstance(event, RunStarted):
                info.job, info.params, info.started = event.job, event.params, event.time
                # (A RunStarted's params passed the event's checks; bound them as run.json's are.)
                if not bounded_dict(info.params):
                    info.params = {}
            elif isinstance(event, RunFinished):
                info.status, info.summary, info.error, info.finished = event.status, event.summary, event.error, stamp
            elif isinstance(event, Metric):
                info.final_metrics[event.final_name] = event.value

        info.problems.extend(fold_events(self.stream(info.run_id), visit))
        info.name = readable_run_name(info.job, info.params)

    def _refresh_from_events(self, info: RunInfo) -> None:
        """For an interrupted run, the last metrics and time come from its events."""

        def visit(stamp: float | None, event: Event) -> None:
            if isinstance(event, Metric):
                info.final_metrics[event.final_name] = event.value
            if stamp is not None:
                info.finished = stamp

        fold_events(self.stream(info.run_id), visit)

    def list_runs(self) -> list[RunInfo]:
        """Every run, oldest first. A run that cannot be read at all still lists, with what went wrong.

        In a store, the run.json of every run not read before is fetched in
        one concurrent batch (a bucket of a thousand runs opens in about a
        second against an emulator), and ended runs are never fetched again.
        """
        run_ids = self.run_ids()
        prefetched: dict[str, bytes | Exception] = {}
        if not self.local:
            unread = [run_id for run_id in run_ids if run_id not in self._ended and run_id not in self._recorded]
            prefetched = self.backend.read_many(unread, RUN_FILE, MAX_RUN_FILE_BYTES)
        infos = []
        for run_id in run_ids:
            try:
                infos.append(self.info(run_id, prefetched.get(run_id)))
            except Exception as error:  # noqa: BLE001 - one bad run must never stop a scan of the others
                infos.append(
                    RunInfo(
                        run_id=run_id,
                        path=self.location(run_id),
                        problems=[f"cannot read: {type(error).__name__}: {error}"],
                    )
                )
        return infos

    def find(self, run_id: str) -> Path | str:
        """The location of ``run_id`` (a unique prefix is enough): a directory, or a URL; KeyError if none."""
        if not isinstance(run_id, str) or not is_run_id(run_id):
            raise KeyError(f"{run_id!r} is not a run id: {RUN_ID_RULE}")
        exact = self.files(run_id)
        if isinstance(exact, LocalRunFiles) and exact.exists():
            return exact.run_dir
        run_ids = self.run_ids()
        matches = [run_id] if run_id in run_ids else [name for name in run_ids if name.startswith(run_id)]
        if len(matches) == 1:
            files = self.files(matches[0])
            if isinstance(files, LocalRunFiles):
                if files.run_dir.is_symlink():
                    raise KeyError(f"run {matches[0]}: a symbolic link to a directory, not followed")
                return files.run_dir
            return files.where
        if not matches:
            raise KeyError(f"no run {run_id!r} in {self.where}")
        raise KeyError(f"run id {run_id!r} is ambiguous: {', '.join(matches[:5])}")

    def load(self, run_id: str) -> RunData:
        found = run_id_of(self.find(run_id))
        info = self.info(found)
        events, problems = read_events(self.stream(found))
        info.problems.extend(problems)
        telemetry, problems = read_events(self.stream(found, TELEMETRY_STREAM))
        info.problems.extend(problems)
        return RunData(info=info, events=events, problems=info.problems, telemetry=telemetry)

    def export(self, run_id: str, fmt: str = "csv") -> str:
        """A run's metrics as CSV (one row per metric point) or JSON, with its telemetry (see ``tpudash.runs.export``)."""
        data = self.load(run_id)
        return export_run(data.info.to_dict(), data.metrics(), data.telemetry, fmt)


def _copy(info: RunInfo) -> RunInfo:
    """A copy a caller may change (its problems are its own)."""
    return dataclasses.replace(info, problems=list(info.problems))
