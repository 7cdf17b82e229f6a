"""The runs directory: create runs, list them (with a cache of ended runs), find, load and export one.

Reading never trusts the files: a truncated line, a malformed run.json or an
unknown event is reported as a problem and the rest is still shown. A run
left ``running`` by a process that no longer exists is reported as
``interrupted``. The file layout is ``tpudash.runs.layout``; writing one run
is ``tpudash.runs.recorder``; reading a growing file is ``tpudash.runs.tail``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.events import Event, Metric, RunFinished, RunStarted, is_finite_number
from tpudash.runs import liveness
from tpudash.runs.export import export_run
from tpudash.runs.layout import (
    EVENTS_FILE,
    RUN_FILE,
    SOURCE_JOB,
    STATUS_INTERRUPTED,
    STATUS_RUNNING,
    TELEMETRY_FILE,
    files_key,
)
from tpudash.runs.recorder import RunRecorder
from tpudash.runs.tail import read_events


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
    pid_start_time: float | None = None
    """When the writing process started (unix time): tells it from a later process given the same pid."""
    pid_start_ticks: str | None = None
    """The same, as runs written by older versions stored it (``pid_start``: clock ticks since boot)."""
    host: str | None = None
    live: bool = False
    """Running, and its writer process is alive on this host: the run is still growing."""

    def writer_alive(self) -> bool | None:
        """Whether the writing process still exists (None: it is on another host, or unknown)."""
        if self.host != socket.gethostname() or self.host is None:
            return None
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
    ) -> RunRecorder:
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
            "pid_start_time": liveness.process_start_time(os.getpid()),
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
        info.started = float(meta["started"]) if is_finite_number(meta.get("started")) else None
        info.finished = float(meta["finished"]) if is_finite_number(meta.get("finished")) else None
        info.params = meta.get("params") if isinstance(meta.get("params"), dict) else {}
        info.summary = meta.get("summary") if isinstance(meta.get("summary"), dict) else {}
        info.final_metrics = meta.get("final_metrics") if isinstance(meta.get("final_metrics"), dict) else {}
        info.error = meta.get("error")
        info.source = str(meta.get("source", SOURCE_JOB))
        info.pid = meta.get("pid") if isinstance(meta.get("pid"), int) else None
        info.pid_start_time = float(meta["pid_start_time"]) if is_finite_number(meta.get("pid_start_time")) else None
        info.pid_start_ticks = meta.get("pid_start") if isinstance(meta.get("pid_start"), str) else None
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
        """A run's metrics as CSV (one row per metric point) or JSON, with its telemetry (see ``tpudash.runs.export``)."""
        data = self.load(run_id)
        return export_run(data.info.to_dict(), data.metrics(), data.telemetry, fmt)
