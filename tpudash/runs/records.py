"""A run's record read back: run.json checked field by field, or its events when run.json is unusable.

``RunInfo`` is what the History screen and ``tpudash runs`` show of one run;
``read_record`` makes one from run.json's bytes (fetched alone or in a
batch), never trusting them: a field that breaks its rule is left out and
named in the run's problems. A run without a usable run.json is told from
its events (``info_from_events``). Whether a running run's writer is still
alive is the judge's (``tpudash.runs.judge``); caching is the store's.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from jobs.events import Event, Metric, RunFinished, RunStarted
from tpudash.runs import liveness
from tpudash.runs.backends import RunFiles
from tpudash.runs.layout import (
    MAX_RUN_FILE_BYTES,
    RUN_FILE,
    SOURCE_JOB,
    STATUS_INTERRUPTED,
    RefusedFile,
    parse_run_file,
    readable_run_name,
)
from tpudash.runs.record_fields import bounded_dict, checked_field
from tpudash.runs.segments import StreamTail
from tpudash.runs.tail import fold_events

EventsOf = Callable[[str], StreamTail]
"""A reader of a run's events by its id (``RunStore.stream``)."""
# What the MFU's sources (``summary.mfu.peak_source``, ``runtime.mfu_peak.source``) keep, as ``advice.mfu.Mfu`` does.
MAX_SOURCE_CHARS = 500


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
    record_key: tuple | None = field(default=None, repr=False, compare=False)
    """run.json's key (``RunFiles.key``) when it was read, if the reader knew it: what changes when the record does."""
    mfu_peak_source: str | None = None
    """run.json's ``runtime.mfu_peak.source``: the peak the run's MFU is measured against, said at its start."""

    @property
    def mfu(self) -> float | None:
        """The run's MFU, a fraction: its summary's (at its finish), else its newest epoch's; None when unmeasured."""
        measured = summary_mfu(self.summary)
        value = measured.get("mfu") if measured is not None else None
        if value is not None:
            return float(value)
        newest = self.final_metrics.get("mfu")
        return float(newest) if _is_fraction(newest) else None

    @property
    def peak_source(self) -> str | None:
        """Where the MFU's peak comes from: the summary's MFU, else what the run said at its start; None unsaid."""
        measured = summary_mfu(self.summary)
        if measured is not None and measured.get("peak_source"):
            return str(measured["peak_source"])[:MAX_SOURCE_CHARS]
        return self.mfu_peak_source

    def writer_alive(self) -> bool | None:
        """Whether the run's writer is still writing it (None: it cannot be told, such as an old run of another host).

        In a store, its writers' heartbeats (``liveness.store_writers_alive``;
        None when the store cannot be asked). Locally, its lock on this host,
        its heartbeat from another (``liveness.writer_alive``); runs written
        before the lock existed are judged by their pid on this host.
        """
        if self.files is not None and self.files.local_dir is None:
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
            "mfu": self.mfu,
            "peak_source": self.peak_source,
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


def run_id_of(run: str | Path) -> str:
    """The run id in a run's location (its directory or URL), or the id itself."""
    return str(run).rstrip("/").rsplit("/", 1)[-1]


def copy_info(info: RunInfo) -> RunInfo:
    """A copy a caller may change (its problems are its own).

    Field by field, not ``dataclasses.replace``: a listing copies every ended run it holds, and
    replace's keyword checks cost 60 µs a run on a loaded machine (0.6 s for 10,000 runs), this 1 µs.
    """
    copied = object.__new__(RunInfo)
    copied.__dict__.update(info.__dict__)
    copied.problems = list(info.problems)
    return copied


def _as_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_fraction(value: Any) -> TypeGuard[float]:
    """An MFU: a finite number ≥ 0 (a fraction; above 1 only when a peak was misjudged, still said)."""
    return _is_number(value) and math.isfinite(value) and value >= 0


def summary_mfu(summary: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``summary["mfu"]`` (``advice.mfu.Mfu.to_json``) when its figure is a fraction or null and its source text."""
    measured = summary.get("mfu")
    if not isinstance(measured, Mapping):
        return None
    figure, source = measured.get("mfu"), measured.get("peak_source", "")
    if (figure is not None and not _is_fraction(figure)) or not isinstance(source, str):
        return None
    return measured


def _checked_mfu_fields(info: RunInfo, runtime: Any, problems: list[str]) -> None:
    """The summary's MFU and the runtime's peak source, checked: one that breaks its rule is left out and named."""
    if "mfu" in info.summary and summary_mfu(info.summary) is None:
        problems.append(
            f'{RUN_FILE}: summary.mfu must be {{"mfu": a fraction or null, "peak_source": text, …}}, '
            f"not {info.summary['mfu']!r:.40}"
        )
        info.summary = {name: value for name, value in info.summary.items() if name != "mfu"}
    peak = runtime.get("mfu_peak") if isinstance(runtime, Mapping) else None
    if peak is None:
        return
    source = peak.get("source") if isinstance(peak, Mapping) else None
    if isinstance(source, str):
        info.mfu_peak_source = source[:MAX_SOURCE_CHARS]
    else:
        problems.append(f"{RUN_FILE}: runtime.mfu_peak.source must be text, not {source!r:.40}")


def read_record(run_id: str, files: RunFiles, prefetched: bytes | Exception | None, events_of: EventsOf) -> RunInfo:
    """run.json read with every field checked: a field that breaks its rule is left out and named.

    ``prefetched``: run.json's bytes (or the error reading them) from a batch
    read; None reads it here. Without a usable run.json, the run is told from its events.
    """
    info = RunInfo(run_id=run_id, path=files.where, files=files)
    if files.local_dir is not None and files.local_dir.is_symlink():
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
        info_from_events(info, events_of(run_id))
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
    _checked_mfu_fields(info, meta.get("runtime"), problems)
    return info


def info_from_events(info: RunInfo, events: StreamTail) -> None:
    """A run with no usable run.json, told from its events: interrupted unless it recorded its finish."""
    info.status = STATUS_INTERRUPTED

    def visit(stamp: float | None, event: Event) -> None:
        if isinstance(event, RunStarted):
            info.job, info.params, info.started = event.job, event.params, event.time
            _checked_mfu_fields(info, event.runtime, info.problems)
            # (A RunStarted's params passed the event's checks; bound them as run.json's are.)
            if not bounded_dict(info.params):
                info.params = {}
        elif isinstance(event, RunFinished):
            info.status, info.summary, info.error, info.finished = event.status, event.summary, event.error, stamp
        elif isinstance(event, Metric):
            info.final_metrics[event.final_name] = event.value

    info.problems.extend(fold_events(events, visit))
    info.name = readable_run_name(info.job, info.params)
    _checked_mfu_fields(info, None, info.problems)  # the finish's summary, read after the start's runtime


def refresh_from_events(info: RunInfo, events: StreamTail) -> None:
    """For an interrupted run, the last metrics and time come from its events."""

    def visit(stamp: float | None, event: Event) -> None:
        if isinstance(event, Metric):
            info.final_metrics[event.final_name] = event.value
        if stamp is not None:
            info.finished = stamp

    fold_events(events, visit)
