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
    UnknownEventError,
    dumps,
    event_from_dict,
    to_jsonable,
)

EVENTS_FILE = "events.jsonl"
RUN_FILE = "run.json"
FSYNC_INTERVAL_SECONDS = 1.0
STATUS_RUNNING = "running"
STATUS_INTERRUPTED = "interrupted"


def new_run_id(job: str, now: float | None = None) -> str:
    """``20261121-025100-matmul-1a2b3c``: sortable by start time, unique."""
    stamp = datetime.fromtimestamp(now if now is not None else time.time(), tz=timezone.utc)
    return f"{stamp:%Y%m%d-%H%M%S}-{job}-{secrets.token_hex(3)}"


def _process_start_ticks(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (guards against a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces; the fields after it are fixed.
    return stat.rsplit(")", 1)[1].split()[19]


def process_alive(pid: int, start_ticks: str | None) -> bool:
    """Whether the process that wrote a run still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if start_ticks is None:
        return True
    current = _process_start_ticks(pid)
    return current is None or current == start_ticks


def metric_key(event: Metric) -> str:
    """How run.json names a metric: ``loss`` for train, ``val_loss`` for val."""
    return event.name if event.split == "train" else f"{event.split}_{event.name}"


def write_json_atomically(path: Path, payload: dict) -> None:
    """Write to a temp file beside ``path``, fsync, then os.replace it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


class RunRecorder:
    """Writes one run's events and its run.json; used as a runner sink."""

    def __init__(self, run_dir: Path, meta: dict):
        self.run_dir = run_dir
        self.meta = dict(meta)
        self._lock = threading.Lock()
        self._events = open(run_dir / EVENTS_FILE, "a", encoding="utf-8")
        self._last_fsync = time.monotonic()
        self._final_metrics: dict[str, float] = {}
        self._closed = False
        self._write_meta()

    def _write_meta(self) -> None:
        self.meta["final_metrics"] = dict(self._final_metrics)
        write_json_atomically(self.run_dir / RUN_FILE, to_jsonable(self.meta))

    def record(self, event: Event, timestamp: float | None = None) -> None:
        """Append one event; fsync on schedule, at epochs and at the finish."""
        timestamp = time.time() if timestamp is None else timestamp
        with self._lock:
            if self._closed:
                return
            self._events.write(dumps(event, timestamp) + "\n")
            self._events.flush()
            if isinstance(event, Metric):
                self.remember_metric(event)
            now = time.monotonic()
            epoch_boundary = isinstance(event, Progress) and event.unit == "epoch"
            if epoch_boundary or now - self._last_fsync >= FSYNC_INTERVAL_SECONDS:
                os.fsync(self._events.fileno())
                self._last_fsync = now
            if epoch_boundary:
                self._write_meta()
            if isinstance(event, RunFinished):
                os.fsync(self._events.fileno())
                self.meta.update(
                    status=event.status,
                    finished=timestamp,
                    summary=event.summary,
                    error=event.error,
                )
                self._write_meta()
                self._events.close()
                self._closed = True

    def remember_metric(self, event: Metric) -> None:
        """Keep ``event`` as its metric's latest value for run.json's final_metrics."""
        self._final_metrics[metric_key(event)] = event.value

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._events.close()
                self._closed = True


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
        }


@dataclass
class RunData:
    """A run read back: its info, the events that parsed, and what did not."""

    info: RunInfo
    events: list[tuple[float | None, Event]]
    problems: list[str]

    def metrics(self) -> list[tuple[float | None, Metric]]:
        return [(stamp, event) for stamp, event in self.events if isinstance(event, Metric)]


def read_events(path: Path) -> tuple[list[tuple[float | None, Event]], list[str]]:
    """Every event that parses, with its timestamp, plus one problem per bad line."""
    events: list[tuple[float | None, Event]] = []
    problems: list[str] = []
    try:
        handle = open(path, encoding="utf-8", errors="replace")
    except OSError as error:
        return events, [f"{path.name}: cannot read ({error.strerror or error})"]
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                payload = json.loads(line)
                events.append((payload.get("t") if isinstance(payload, dict) else None, event_from_dict(payload)))
            except (json.JSONDecodeError, UnknownEventError) as error:
                reason = "truncated or not JSON" if isinstance(error, json.JSONDecodeError) else str(error)
                problems.append(f"{path.name} line {number}: {reason}")
    return events, problems


class EventTail:
    """Follows a run's events.jsonl as its writer appends: each ``read_new`` returns the events added since.

    A line is read only once it is complete (the writer may be mid-line); a
    line that does not parse is counted in ``problems`` and skipped. The file
    may not exist yet (the engine has not started the run).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._handle: IO[bytes] | None = None
        self._partial = b""
        self.problems = 0
        self.finished = False
        """True once a RunFinished was read: nothing more will come."""

    def read_new(self) -> list[tuple[float | None, Event]]:
        if self._handle is None:
            try:
                self._handle = open(self.path, "rb")
            except OSError:
                return []
        chunk = self._handle.read()
        if not chunk:
            return []
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        events: list[tuple[float | None, Event]] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                payload = json.loads(line)
                event = event_from_dict(payload)
            except (json.JSONDecodeError, UnknownEventError, UnicodeDecodeError):
                self.problems += 1
                continue
            events.append((payload.get("t"), event))
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

    def create(self, run_id: str, job: str, params: dict, runtime: dict) -> RunRecorder:
        run_dir = self.root / run_id
        run_dir.mkdir(parents=True, exist_ok=False)
        meta = {
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
        return RunRecorder(run_dir, meta)

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
        """run.json of one run, falling back to its events when run.json is unusable."""
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
        if info.status == STATUS_RUNNING and meta.get("host") == socket.gethostname():
            pid = meta.get("pid")
            if not isinstance(pid, int) or not process_alive(pid, meta.get("pid_start")):
                info.status = STATUS_INTERRUPTED
                self._refresh_from_events(info)
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
                info.final_metrics[metric_key(event)] = event.value

    def _refresh_from_events(self, info: RunInfo) -> None:
        """For an interrupted run, the last metrics and time come from its events."""
        events, _ = read_events(info.path / EVENTS_FILE)
        for stamp, event in events:
            if isinstance(event, Metric):
                info.final_metrics[metric_key(event)] = event.value
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
        return RunData(info=info, events=events, problems=info.problems)

    def export(self, run_id: str, fmt: str = "csv") -> str:
        """A run's metrics as CSV (one row per metric point) or JSON."""
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
            return json.dumps({"run": data.info.to_dict(), "metrics": rows}, indent=2)
        if fmt != "csv":
            raise ValueError(f"format: {fmt!r} is not allowed; allowed: csv, json")
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=["time", "name", "split", "step", "epoch", "value"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buffer.getvalue()


def _number_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def metric_series(events: Iterable[tuple[float | None, Event]], name: str, split: str = "train") -> list[tuple[int, float]]:
    """(step, value) pairs of one metric, in order: what plots and overlays use."""
    return [
        (event.step, event.value)
        for _, event in events
        if isinstance(event, Metric) and event.name == name and event.split == split
    ]
