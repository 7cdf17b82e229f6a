"""Run directories on disk: events.jsonl, run.json, exports.

``<runs_dir>/<UTC yyyymmdd-HHMMSS>-<job>-<6 hex>/`` holds ``events.jsonl``
(one event per line, written through to the OS at every event so a killed
process loses nothing it emitted, fsynced at least every second and at every
epoch and finish so a dead machine loses at most a second) and ``run.json``
(replaced atomically). A run left ``running`` by a process that no longer
exists is reported as ``interrupted``. Reading never trusts the files: a
truncated line, a malformed run.json or an unknown event is reported as a
problem and the rest is still shown.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Iterable

from jobs.events import (
    Event,
    Metric,
    Progress,
    RunFinished,
    RunStarted,
    dumps,
    event_from_dict,
    event_to_dict,
    to_jsonable,
)

EVENTS_FILE = "events.jsonl"
RUN_FILE = "run.json"
# Samples of the accelerator and host taken while the run was live, written
# by whoever observed it (tpudash.telemetry.sampling), never by the run's own process.
TELEMETRY_FILE = "telemetry.jsonl"
FSYNC_INTERVAL_SECONDS = 1.0
STATUS_RUNNING = "running"
STATUS_INTERRUPTED = "interrupted"
# Who wrote a run: a tpudash job, the user's model.fit with TpudashCallback,
# or the user's own loop through tpudash.record.
SOURCE_JOB = "job"
SOURCE_CALLBACK = "keras-callback"
SOURCE_RECORD = "record"


def new_run_id(job: str, now: float | None = None) -> str:
    """``20261121-025100-matmul-1a2b3c``: sortable by start time, unique."""
    stamp = datetime.fromtimestamp(now if now is not None else time.time(), tz=timezone.utc)
    return f"{stamp:%Y%m%d-%H%M%S}-{job}-{secrets.token_hex(3)}"


def _process_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces; the fields after it are fixed.
    return stat.rsplit(")", 1)[1].split()


def _process_start_ticks(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (guards against a reused pid)."""
    fields = _process_stat(pid)
    return fields[19] if fields is not None else None


def process_alive(pid: int, start_ticks: str | None) -> bool:
    """Whether the process that wrote a run still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _process_stat(pid)
    if fields is None:
        return True  # no /proc to ask: the pid exists
    if fields[0] in ("Z", "X"):
        return False  # it has exited; its parent has not collected it yet
    return start_ticks is None or fields[19] == start_ticks


def write_json_atomically(path: Path, payload: dict) -> None:
    """Write to a temp file beside ``path``, fsync, then os.replace it.

    A write that fails (a full disk) leaves ``path`` as it was and removes
    the half-written temp file.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


class RunRecorder:
    """Writes one run's events and its run.json; used as a runner sink.

    Write-through (the default, for jobs): every event reaches the OS as it
    is recorded, so the dashboard tailing the file sees it at once. Buffered
    (``flush_interval`` > 0, for the user's own training): ``record`` only
    appends to memory, and a writer thread writes every ``flush_interval``
    seconds, fsyncs at most every second and rewrites run.json at epochs, so
    the training thread never waits for the disk. Either way the finish is
    written and fsynced before ``record`` returns.
    """

    def __init__(self, run_dir: Path, meta: dict, *, flush_interval: float = 0.0):
        self.run_dir = run_dir
        self.meta = dict(meta)
        self.flush_interval = flush_interval
        self.write_error: OSError | None = None
        """The first error the writer thread met (a full disk); training goes on without the record."""
        self._lock = threading.Lock()  # the buffer, meta and final metrics
        self._io_lock = threading.Lock()  # the files
        self._pending: list[str] = []
        self._meta_due = False
        self._unsynced = False
        self._last_fsync = time.monotonic()
        self._final_metrics: dict[str, float] = {}
        self._closed = False
        # run.json first: a reader finding the directory learns at once whose run it is.
        self._write_meta(self._meta_snapshot())
        self._events = open(run_dir / EVENTS_FILE, "a", encoding="utf-8")
        self._writer: threading.Thread | None = None
        self._writer_stop = threading.Event()
        if flush_interval > 0:
            self._writer = threading.Thread(target=self._write_periodically, name=f"tpudash-record-{run_dir.name}",
                                            daemon=True)
            self._writer.start()

    def _meta_snapshot(self) -> dict:
        return dict(self.meta, final_metrics=dict(self._final_metrics))

    def _write_meta(self, meta: dict) -> None:
        write_json_atomically(self.run_dir / RUN_FILE, to_jsonable(meta))

    def record(self, event: Event, timestamp: float | None = None) -> None:
        """Append one event; fsync on schedule, at epochs and at the finish."""
        timestamp = time.time() if timestamp is None else timestamp
        line = dumps(event, timestamp) + "\n"
        finished = isinstance(event, RunFinished)
        with self._lock:
            if self._closed:
                return
            self._pending.append(line)
            if isinstance(event, Metric):
                self.remember_metric(event)
            epoch_boundary = isinstance(event, Progress) and event.unit == "epoch"
            if epoch_boundary:
                self._meta_due = True
            if finished:
                self._closed = True
                self.meta.update(status=event.status, finished=timestamp, summary=event.summary, error=event.error)
                self._meta_due = True
        if finished:
            self._stop_writer()
            self._write_pending(sync=True)
            with self._io_lock:
                self._events.close()
        elif self._writer is None:
            self._write_pending(sync=epoch_boundary)

    def _write_pending(self, sync: bool = False) -> None:
        """Write what is buffered; fsync when asked, when run.json is due, or a second after the last."""
        with self._io_lock:
            with self._lock:
                lines, self._pending = self._pending, []
                meta = self._meta_snapshot() if self._meta_due else None
                self._meta_due = False
            if self._events.closed:
                return
            if lines:
                self._events.write("".join(lines))
                self._events.flush()
                self._unsynced = True
            now = time.monotonic()
            if self._unsynced and (sync or meta is not None or now - self._last_fsync >= FSYNC_INTERVAL_SECONDS):
                os.fsync(self._events.fileno())
                self._last_fsync, self._unsynced = now, False
            if meta is not None:
                self._write_meta(meta)

    def flush(self) -> None:
        """Write what is buffered now, and fsync it (a buffered recorder before a long pause)."""
        self._write_pending(sync=True)

    def _write_periodically(self) -> None:
        while not self._writer_stop.wait(self.flush_interval):
            try:
                self._write_pending()
            except OSError as error:
                # The user's training must go on; the error is kept for them to read.
                self.write_error = self.write_error or error

    def _stop_writer(self) -> None:
        if self._writer is not None:
            self._writer_stop.set()
            if self._writer is not threading.current_thread():
                self._writer.join()
            self._writer = None

    def remember_metric(self, event: Metric) -> None:
        """Keep ``event`` as its metric's latest value for run.json's final_metrics."""
        self._final_metrics[event.final_name] = event.value

    def close(self) -> None:
        """Write what is buffered and close, without a finish (the run reads as interrupted)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop_writer()
        self._write_pending(sync=True)
        with self._io_lock:
            self._events.close()


@dataclass
class RunInfo:
    """What the History screen and ``tpudash runs`` show of one run."""

    run_id: str
    path: Path
    job: str = "?"
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
    pid_start: str | None = None
    host: str | None = None
    live: bool = False
    """Running, and its writer process is alive on this host: the run is still growing."""

    def writer_alive(self) -> bool | None:
        """Whether the writing process still exists (None: it is on another host, or unknown)."""
        if self.host != socket.gethostname() or self.host is None:
            return None
        return isinstance(self.pid, int) and process_alive(self.pid, self.pid_start)

    @property
    def duration(self) -> float | None:
        if self.started is None:
            return None
        end = self.finished if self.finished is not None else None
        return None if end is None else max(0.0, end - self.started)

    def to_dict(self) -> dict:
        return {
            "run_id": self.run_id,
            "path": str(self.path),
            "job": self.job,
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
            "live": self.live,
        }


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


MAX_PROBLEMS_KEPT = 100


def parse_event_line(line: str | bytes) -> tuple[float | None, Event]:
    """One line of events.jsonl as (timestamp, event); ValueError names what is wrong with it."""
    try:
        payload = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("truncated or not JSON") from None
    event = event_from_dict(payload)  # UnknownEventError is a ValueError
    return payload.get("t"), event


def read_events(path: Path) -> tuple[list[tuple[float | None, Event]], list[str]]:
    """Every event that parses, with its timestamp, plus one problem per bad line."""
    tail = EventTail(path)
    try:
        events = tail.read_new(final=True)
    except OSError as error:
        return [], [f"{path.name}: cannot read ({error.strerror or error})"]
    finally:
        tail.close()
    return events, tail.problems


class EventTail:
    """Follows a run's events.jsonl as its writer appends: each ``read_new`` returns the events added since.

    A line is read only once it is complete (the writer may be mid-line),
    unless ``final`` says the writer is gone; a line that does not parse is
    named in ``problems`` (the first hundred) and skipped. A missing file
    reads as no events yet (the engine has not started the run).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._handle: IO[bytes] | None = None
        self._partial = b""
        self._line_number = 0
        self.problems: list[str] = []
        self.problem_count = 0
        self.finished = False
        """True once a RunFinished was read: nothing more will come."""

    def read_new(self, final: bool = False) -> list[tuple[float | None, Event]]:
        """The events completed since the last call; ``final``: also a last line without its newline.

        Raises OSError only when ``final`` and the file exists but cannot be read.
        """
        if self._handle is None:
            try:
                self._handle = open(self.path, "rb")
            except OSError:
                if final:
                    raise
                return []
        chunk = self._handle.read()
        if not chunk and not (final and self._partial):
            return []
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        if final and self._partial:
            lines.append(self._partial)
            self._partial = b""
        events: list[tuple[float | None, Event]] = []
        for line in lines:
            self._line_number += 1
            if not line.strip():
                continue
            try:
                stamp, event = parse_event_line(line)
            except ValueError as error:
                self.problem_count += 1
                if len(self.problems) < MAX_PROBLEMS_KEPT:
                    self.problems.append(f"{self.path.name} line {self._line_number}: {error}")
                continue
            events.append((stamp, event))
            if isinstance(event, RunFinished):
                self.finished = True
        return events

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class RunStore:
    """The runs directory: create runs, list them, load and export one."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._infos: dict[str, tuple[tuple, RunInfo]] = {}

    def create(self, run_id: str, job: str, params: dict, runtime: dict, *, source: str = SOURCE_JOB,
               flush_interval: float = 0.0) -> RunRecorder:
        """A new run directory and its recorder (``flush_interval``: see ``RunRecorder``)."""
        run_dir = self.root / run_id
        run_dir.mkdir(parents=True, exist_ok=False)
        meta = {
            "source": source,
            "run_id": run_id,
            "job": job,
            "params": params,
            "runtime": runtime,
            "status": STATUS_RUNNING,
            "started": time.time(),
            "finished": None,
            "pid": os.getpid(),
            "pid_start": _process_start_ticks(os.getpid()),
            "host": socket.gethostname(),
        }
        return RunRecorder(run_dir, meta, flush_interval=flush_interval)

    def finish_abandoned(self, run_id: str, job: str, params: dict, status: str, error: str | None) -> None:
        """End a run whose writer died (a killed engine): append RunFinished and update run.json.

        Everything the run reported stays; its final metrics are read back
        from its events. A run the writer never created is created here, so
        even a job that died before it started has a record. A run that
        already ended is left as it is.
        """
        run_dir = self.root / run_id
        events, _ = read_events(run_dir / EVENTS_FILE)
        if any(isinstance(event, RunFinished) for _, event in events):
            return
        try:
            meta = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            meta = None
        if not isinstance(meta, dict):
            recorder = self.create(run_id, job, params, {}) if not run_dir.exists() else RunRecorder(
                run_dir, {"run_id": run_id, "job": job, "params": params, "status": STATUS_RUNNING,
                          "started": time.time(), "host": socket.gethostname()})
            if not events:
                recorder.record(RunStarted(run_id, job, params, {}, time.time()))
        else:
            recorder = RunRecorder(run_dir, meta)
        for _, event in events:
            if isinstance(event, Metric):
                recorder.remember_metric(event)
        recorder.record(RunFinished(status=status, summary={}, error=error, traceback=None))

    def run_dirs(self) -> list[Path]:
        try:
            entries = [entry for entry in self.root.iterdir() if entry.is_dir() and not entry.name.startswith(".")]
        except OSError:
            return []
        return sorted(entries, key=lambda entry: entry.name)

    def info(self, run_dir: Path) -> RunInfo:
        """run.json of one run, falling back to its events when run.json is unusable.

        An ended run is read once while its files stay as they are: the
        History screen lists the directory every second to show new and live
        runs, and thousands of old runs must not be read again each time.
        """
        key = files_key(run_dir)
        cached = self._infos.get(run_dir.name)
        if cached is not None and key is not None and cached[0] == key and cached[1].status != STATUS_RUNNING:
            info = cached[1]
        else:
            info = self._read_info(run_dir)
            if key is not None:
                self._infos[run_dir.name] = (key, info)
        return dataclasses.replace(info, problems=list(info.problems))

    def _read_info(self, run_dir: Path) -> RunInfo:
        info = RunInfo(run_id=run_dir.name, path=run_dir)
        meta: Any = None
        try:
            meta = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
            if not isinstance(meta, dict):
                raise ValueError("not an object")
        except FileNotFoundError:
            info.problems.append(f"{RUN_FILE}: missing")
            meta = None
        except (OSError, ValueError) as error:
            info.problems.append(f"{RUN_FILE}: unreadable ({getattr(error, 'strerror', None) or error})")
            meta = None
        if meta is None:
            self._info_from_events(info)
            return info
        info.job = str(meta.get("job", "?"))
        info.status = str(meta.get("status", "unknown"))
        info.started = _number_or_none(meta.get("started"))
        info.finished = _number_or_none(meta.get("finished"))
        info.params = meta.get("params") if isinstance(meta.get("params"), dict) else {}
        info.summary = meta.get("summary") if isinstance(meta.get("summary"), dict) else {}
        info.final_metrics = meta.get("final_metrics") if isinstance(meta.get("final_metrics"), dict) else {}
        info.error = meta.get("error")
        info.source = str(meta.get("source", SOURCE_JOB))
        info.pid = meta.get("pid") if isinstance(meta.get("pid"), int) else None
        info.pid_start = meta.get("pid_start") if isinstance(meta.get("pid_start"), str) else None
        info.host = meta.get("host") if isinstance(meta.get("host"), str) else None
        if info.status == STATUS_RUNNING:
            alive = info.writer_alive()
            if alive is False:
                info.status = STATUS_INTERRUPTED
                self._refresh_from_events(info)
            info.live = bool(alive)
        return info

    def _info_from_events(self, info: RunInfo) -> None:
        events, problems = read_events(info.path / EVENTS_FILE)
        info.problems.extend(problems)
        info.status = STATUS_INTERRUPTED
        for stamp, event in events:
            if isinstance(event, RunStarted):
                info.job, info.params, info.started = event.job, event.params, event.time
            elif isinstance(event, RunFinished):
                info.status, info.summary, info.error, info.finished = event.status, event.summary, event.error, stamp
            elif isinstance(event, Metric):
                info.final_metrics[event.final_name] = event.value

    def _refresh_from_events(self, info: RunInfo) -> None:
        """For an interrupted run, the last metrics and time come from its events."""
        events, _ = read_events(info.path / EVENTS_FILE)
        for stamp, event in events:
            if isinstance(event, Metric):
                info.final_metrics[event.final_name] = event.value
            if stamp is not None:
                info.finished = stamp

    def list_runs(self) -> list[RunInfo]:
        """Every run, oldest first."""
        return [self.info(run_dir) for run_dir in self.run_dirs()]

    def find(self, run_id: str) -> Path:
        """The directory of ``run_id`` (a unique prefix is enough)."""
        exact = self.root / run_id
        if run_id and "/" not in run_id and exact.is_dir():
            return exact
        matches = [path for path in self.run_dirs() if path.name.startswith(run_id)] if run_id else []
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise KeyError(f"no run {run_id!r} in {self.root}")
        raise KeyError(f"run id {run_id!r} is ambiguous: {', '.join(path.name for path in matches[:5])}")

    def load(self, run_id: str) -> RunData:
        run_dir = self.find(run_id)
        info = self.info(run_dir)
        events, problems = read_events(run_dir / EVENTS_FILE)
        info.problems.extend(problems)
        telemetry: list[tuple[float | None, Event]] = []
        if (run_dir / TELEMETRY_FILE).exists():
            telemetry, problems = read_events(run_dir / TELEMETRY_FILE)
            info.problems.extend(problems)
        return RunData(info=info, events=events, problems=info.problems, telemetry=telemetry)

    def export(self, run_id: str, fmt: str = "csv") -> str:
        """A run's metrics as CSV (one row per metric point) or JSON, with its telemetry.

        In CSV a telemetry sample is a row per value (``tpu0_duty_cycle_pct``,
        ``host_cpu_pct``…) with split ``telemetry`` and the sample's number
        as its step; JSON has the samples whole under ``telemetry``.
        """
        from tpudash.telemetry.sampling import scalars

        data = self.load(run_id)
        rows = [
            {
                "time": stamp,
                "name": metric.name,
                "split": metric.split,
                "step": metric.step,
                "epoch": metric.epoch,
                "value": metric.value,
            }
            for stamp, metric in data.metrics()
        ]
        if fmt == "json":
            samples = [{"time": stamp, **event_to_dict(sample)} for stamp, sample in data.telemetry]
            return json.dumps({"run": data.info.to_dict(), "metrics": rows, "telemetry": samples}, indent=2)
        rows += [
            {"time": stamp, "name": name, "split": "telemetry", "step": number, "epoch": None, "value": value}
            for number, (stamp, sample) in enumerate(data.telemetry)
            for name, value in scalars(sample).items()
        ]
        if fmt != "csv":
            raise ValueError(f"format: {fmt!r} is not allowed; allowed: csv, json")
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=["time", "name", "split", "step", "epoch", "value"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buffer.getvalue()


def files_key(run_dir: Path) -> tuple | None:
    """What changes when a run's record changes: run.json's (else events.jsonl's) mtime and size."""
    for name in (RUN_FILE, EVENTS_FILE):
        try:
            stat = (run_dir / name).stat()
        except OSError:
            continue
        return name, stat.st_mtime_ns, stat.st_size
    return None


def _number_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def metric_series(events: Iterable[tuple[float | None, Event]], name: str, split: str = "train") -> list[tuple[int, float]]:
    """(step, value) pairs of one metric, in order: what plots and overlays use."""
    return [
        (event.step, event.value)
        for _, event in events
        if isinstance(event, Metric) and event.name == name and event.split == split
    ]
