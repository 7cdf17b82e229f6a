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

from jobs.events import (
    MAX_NAME_CHARS,
    MAX_TEXT_CHARS,
    Event,
    Metric,
    RunFinished,
    RunStarted,
    is_sane_timestamp,
    json_size,
)
from tpudash.runs import liveness
from tpudash.runs.export import export_run
from tpudash.runs.layout import (
    EVENTS_FILE,
    RUN_FILE,
    RUN_ID_RULE,
    SOURCE_JOB,
    STATUS_INTERRUPTED,
    STATUS_RUNNING,
    TELEMETRY_FILE,
    RefusedFile,
    files_key,
    is_run_id,
    read_run_file,
    readable_run_name,
)
from tpudash.runs.recorder import RunRecorder
from tpudash.runs.tail import fold_events, read_events

# A pid as Linux gives them (pid_max is at most 2**22): anything else in run.json is not a process to look at.
MAX_PID = 2**22
# params, summary and final_metrics: values counted through every level.
MAX_RECORD_VALUES = 10_000


def checked_field(meta: dict, name: str, problems: list[str]) -> Any:
    """run.json's ``name`` if it is what the field may hold, else None with the problem named."""
    value = meta.get(name)
    if value is None:
        return None
    allowed = RUN_FIELD_RULES[name]
    if allowed[1](value):
        return value
    problems.append(f"{RUN_FILE}: {name} must be {allowed[0]}, not {value!r:.40}")
    return None


def _bounded_dict(value: Any) -> bool:
    try:
        return isinstance(value, dict) and json_size(value) <= MAX_RECORD_VALUES
    except ValueError:  # nested too deeply
        return False


# What each field of run.json may hold, as errors say it, and the check.
RUN_FIELD_RULES: dict[str, tuple[str, Any]] = {
    **{name: ("a unix time (1970 to 9999)", is_sane_timestamp) for name in ("started", "finished", "pid_start_time")},
    "pid": (
        f"a process id from 1 to {MAX_PID}",
        lambda value: isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_PID,
    ),
    **{
        name: (
            f"text of at most {MAX_NAME_CHARS} characters",
            lambda value: isinstance(value, str) and len(value) <= MAX_NAME_CHARS,
        )
        for name in ("job", "name", "status", "source", "host", "pid_start")
    },
    "error": (
        f"text of at most {MAX_TEXT_CHARS} characters",
        lambda value: isinstance(value, str) and len(value) <= MAX_TEXT_CHARS,
    ),
    **{
        name: (f"a JSON object of at most {MAX_RECORD_VALUES} values", _bounded_dict)
        for name in ("params", "summary", "final_metrics")
    },
}


@dataclass
class RunInfo:
    """What the History screen and ``tpudash runs`` show of one run."""

    run_id: str
    path: Path
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
    live: bool = False
    """Running, and its writer process is alive on this host: the run is still growing."""

    def writer_alive(self) -> bool | None:
        """Whether the run's writer is still writing it (None: it cannot be told, such as an old run of another host).

        Its lock on this host, its heartbeat from another (``liveness.writer_alive``);
        runs written before the lock existed are judged by their pid on this host.
        """
        on_this_host = self.host is not None and self.host == socket.gethostname()
        judged = liveness.writer_alive(self.path, on_this_host)
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
            "path": str(self.path),
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
            "live": self.live,
        }


def _as_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _links_to_dir(entry: os.DirEntry) -> bool:
    """A symbolic link to a directory: listed so the user sees it, never read through."""
    try:
        return entry.is_symlink() and entry.is_dir()
    except OSError:
        return False


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
    """The runs directory: create runs, list them, load and export one."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._infos: dict[str, tuple[tuple, RunInfo]] = {}

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
    ) -> RunRecorder:
        """A new run directory and its recorder (``flush_interval``: see ``RunRecorder``).

        ``name``: what the user called the run; by default one made from the job and its params.
        """
        run_dir = self.root / run_id
        run_dir.mkdir(parents=True, exist_ok=False)
        meta = {
            "source": source,
            "run_id": run_id,
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
        return RunRecorder(run_dir, meta, flush_interval=flush_interval)

    def finish_abandoned(self, run_id: str, job: str, params: dict, status: str, error: str | None) -> OSError | None:
        """End a run whose writer died (a killed engine): append RunFinished and update run.json.

        Everything the run reported stays; its final metrics are read back
        from its events. RunFinished starts on a line of its own, after a
        last line the writer left cut short (that line reads as one event
        that could not be read). A run the writer never created is created
        here, so even a job that died before it started has a record. A run
        that already ended is left as it is. Returns the error that kept the
        end off the disk (a full disk), or None; it never raises one.
        """
        run_dir = self.root / run_id
        latest: dict[str, Metric] = {}  # per metric, its last point: what run.json's final_metrics keeps
        ended, events_seen = False, 0

        def visit(stamp: float | None, event: Event) -> None:
            nonlocal ended, events_seen
            events_seen += 1
            ended = ended or isinstance(event, RunFinished)
            if isinstance(event, Metric):
                latest[event.final_name] = event

        fold_events(run_dir / EVENTS_FILE, visit)  # in bounded memory, whatever the file holds
        if ended:
            return None
        try:
            meta = read_run_file(run_dir)  # a regular file only, capped: never a FIFO that would block the lane
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
        run_dir = self.root / run_id
        if not isinstance(meta, dict):
            recorder = (
                self.create(run_id, job, params, {})
                if not run_dir.exists()
                else RunRecorder(
                    run_dir,
                    {
                        "run_id": run_id,
                        "job": job,
                        "params": params,
                        "status": STATUS_RUNNING,
                        "started": time.time(),
                        "host": socket.gethostname(),
                    },
                )
            )
            if not events_seen:
                recorder.record(RunStarted(run_id, job, params, {}, time.time()))
        else:
            recorder = RunRecorder(run_dir, meta)
        for metric in metrics:
            recorder.remember_metric(metric)
        recorder.record(RunFinished(status=status, summary={}, error=error, traceback=None))
        return recorder.write_error

    def run_dirs(self) -> list[Path]:
        """Every run directory, by name; a symbolic link to a directory is listed (``info`` says it is not read)."""
        try:
            with os.scandir(self.root) as scan:
                entries = [
                    Path(entry.path)
                    for entry in scan
                    if is_run_id(entry.name) and (entry.is_dir(follow_symlinks=False) or _links_to_dir(entry))
                ]
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
        """run.json read with every field checked: a field that breaks its rule is left out and named."""
        info = RunInfo(run_id=run_dir.name, path=run_dir)
        if run_dir.is_symlink():
            info.problems.append(f"{run_dir.name}: a symbolic link, not followed")
            return info
        meta: Any = None
        try:
            meta = read_run_file(run_dir)
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
        info.name = info.name or readable_run_name(info.job, info.params)
        if info.status == STATUS_RUNNING:
            alive = info.writer_alive()
            if alive is False:
                info.status = STATUS_INTERRUPTED
                self._refresh_from_events(info)
            info.live = bool(alive)
        return info

    def _info_from_events(self, info: RunInfo) -> None:
        info.status = STATUS_INTERRUPTED

        def visit(stamp: float | None, event: Event) -> None:
            if isinstance(event, RunStarted):
                info.job, info.params, info.started = event.job, event.params, event.time
                # (A RunStarted's params passed the event's checks; bound them as run.json's are.)
                if not _bounded_dict(info.params):
                    info.params = {}
            elif isinstance(event, RunFinished):
                info.status, info.summary, info.error, info.finished = event.status, event.summary, event.error, stamp
            elif isinstance(event, Metric):
                info.final_metrics[event.final_name] = event.value

        info.problems.extend(fold_events(info.path / EVENTS_FILE, visit))
        info.name = readable_run_name(info.job, info.params)

    def _refresh_from_events(self, info: RunInfo) -> None:
        """For an interrupted run, the last metrics and time come from its events."""

        def visit(stamp: float | None, event: Event) -> None:
            if isinstance(event, Metric):
                info.final_metrics[event.final_name] = event.value
            if stamp is not None:
                info.finished = stamp

        fold_events(info.path / EVENTS_FILE, visit)

    def list_runs(self) -> list[RunInfo]:
        """Every run, oldest first. A run that cannot be read at all still lists, with what went wrong."""
        infos = []
        for run_dir in self.run_dirs():
            try:
                infos.append(self.info(run_dir))
            except Exception as error:  # noqa: BLE001 - one bad run must never stop a scan of the others
                infos.append(
                    RunInfo(
                        run_id=run_dir.name, path=run_dir, problems=[f"cannot read: {type(error).__name__}: {error}"]
                    )
                )
        return infos

    def find(self, run_id: str) -> Path:
        """The directory of ``run_id`` (a unique prefix is enough); KeyError if none, or not a run id."""
        if not isinstance(run_id, str) or not is_run_id(run_id):
            raise KeyError(f"{run_id!r} is not a run id: {RUN_ID_RULE}")
        exact = self.root / run_id
        if exact.is_dir() and not exact.is_symlink():
            return exact
        matches = [path for path in self.run_dirs() if path.name.startswith(run_id)]
        if len(matches) == 1:
            if matches[0].is_symlink():
                raise KeyError(f"run {matches[0].name}: a symbolic link to a directory, not followed")
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
        """A run's metrics as CSV (one row per metric point) or JSON, with its telemetry (see ``tpudash.runs.export``)."""
        data = self.load(run_id)
        return export_run(data.info.to_dict(), data.metrics(), data.telemetry, fmt)
