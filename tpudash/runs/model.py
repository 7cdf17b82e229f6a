"""What a run's events add up to, without Textual.

``RunModel`` turns a run's events into what the run view draws (bounded metric
histories, the latest per-replica values, result tables, log lines). The live
view feeds it the events a run's events.jsonl gains, the History screen feeds
it stored runs, and a benchmark feeds it a million points.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from jobs.events import (
    TRAINING_STAGE,
    Artifact,
    Event,
    Log,
    Metric,
    Progress,
    ReplicaValues,
    RunFinished,
    RunStarted,
    Stage,
    Table,
    Telemetry,
    is_finite_number,
    split_final_name,
)
from tpudash.format import format_seconds
from tpudash.runs.series import DecimatedSeries, Ema
from tpudash.runs.telemetry_samples import idle_accelerator_hint
from tpudash.telemetry_summary import summarize

MAX_LOG_LINES = 5000
# Metrics named like these are one point of a 2-D path (gradient descent's x0, x1).
PATH_FAMILIES = ("x0", "x1")
# The telemetry plot's lines: label, ``tpudash.telemetry_summary.Summary`` field (all percentages).
TELEMETRY_LINES = (
    ("TPU duty cycle", "duty_cycle_pct"),
    ("HBM used", "hbm_used_pct"),
    ("host CPU", "cpu_pct"),
    ("host memory", "memory_used_pct"),
)
# Enough recent samples for the idle-accelerator hint's window at the fastest rate.
RECENT_TELEMETRY = 300


@dataclass
class MetricTrack:
    """One metric series: a family (loss), a split (train/val/test) and a granularity."""

    family: str
    split: str
    granularity: str  # "batch" (per step within epochs), "epoch", or "step" (no epochs)
    series: DecimatedSeries = field(default_factory=DecimatedSeries)
    smoothed: DecimatedSeries | None = None
    ema: Ema | None = None
    last: float | None = None
    last_step: int | None = None
    count: int = 0

    @property
    def label(self) -> str:
        if self.granularity == "epoch":
            return f"{self.split} (epoch)"
        if self.granularity == "batch":
            return f"{self.split} (batch)"
        return self.split


def classify_metric(metric: Metric) -> tuple[str, str, str]:
    """(family, split, granularity) of a metric event.

    The train job's convention: ``batch_loss`` per batch, ``loss`` per epoch
    (train and val), ``loss`` with split test at the end. Keras-style
    ``val_loss`` with split "train" counts as loss/val and ``epoch_loss`` as
    a per-epoch loss. A metric without an epoch is a plain per-step series
    (gradient descent).
    """
    name, split = metric.name, metric.split or "train"
    if split == "train":
        split, name = split_final_name(name)
    if name.startswith("batch_"):
        return name[len("batch_") :], split, "batch"
    if name.startswith("epoch_"):
        return name[len("epoch_") :], split, "epoch"
    return name, split, "epoch" if metric.epoch is not None else "step"


@dataclass
class ProgressState:
    """Progress of one unit (steps, epochs, devices) and what it implies for the ETA."""

    unit: str
    done: int
    total: int | None
    first_time: float
    first_done: int
    last_time: float

    def eta(self) -> float | None:
        if self.total is None or self.done <= self.first_done or self.last_time <= self.first_time:
            return None
        rate = (self.done - self.first_done) / (self.last_time - self.first_time)
        return max(0.0, (self.total - self.done) / rate)

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(1.0, self.done / self.total)


@dataclass
class StageSpan:
    """One stage of a run (jobs.events.Stage): when it began and ended, its counts."""

    name: str
    began: float
    ended: float | None = None
    done: int | None = None
    total: int | None = None

    def seconds(self, now: float) -> float:
        return max(0.0, (self.ended if self.ended is not None else now) - self.began)


class StageTimeline:
    """A run's stages in order; the last one lasts until the next begins or the run ends."""

    def __init__(self) -> None:
        self.spans: list[StageSpan] = []

    def apply(self, event: Stage, now: float) -> None:
        current = self.spans[-1] if self.spans else None
        if current is None or current.name != event.name:
            self.end(now)
            current = StageSpan(event.name, now)
            self.spans.append(current)
        current.done, current.total = event.done, event.total

    def end(self, now: float) -> None:
        if self.spans and self.spans[-1].ended is None:
            self.spans[-1].ended = now

    @property
    def ready(self) -> bool:
        """True once the run's steps have begun (its TRAINING_STAGE)."""
        return any(span.name == TRAINING_STAGE for span in self.spans)

    def line(self, now: float, finished: bool) -> str | None:
        """What the run is doing now, or how long it took to get going; None without stages.

        While it prepares: ``preparing: tracing and running the first step
        · 4.2s  (making … data 1.5s · building the model 2.8s)``. Once its
        steps run: ``ready in 10.2s: making … data 1.5s · building the
        model 2.8s · tracing and running the first step 5.7s``, after a
        later stage that is not training (evaluating …) with its time.
        """
        if not self.spans:
            return None
        current = self.spans[-1]
        names = [span.name for span in self.spans]
        ready_at = names.index(TRAINING_STAGE) if TRAINING_STAGE in names else None
        if ready_at is not None:
            preparation = self.spans[:ready_at]
        else:
            preparation = self.spans if finished else self.spans[:-1]
        spent = " · ".join(f"{span.name} {format_seconds(span.seconds(now))}" for span in preparation)
        if ready_at is None and finished:
            return f"ended while preparing: {spent}"
        counts = f" {current.done:,}/{current.total:,}" if current.done is not None and current.total else ""
        doing = f"{current.name}{counts} · {format_seconds(current.seconds(now))}"
        if ready_at is None:
            return f"preparing: {doing}" + (f"  ({spent})" if spent else "")
        ready = f"ready in {format_seconds(self.spans[ready_at].began - self.spans[0].began)}: {spent}"
        if current.name != TRAINING_STAGE and current.ended is None:
            return f"{doing}   ({ready})"
        return ready


class RunModel:
    """Everything the run view shows about one run, built from its events.

    ``version`` changes on every event; ``plot_version`` only when a plotted
    series changes, so a view redraws plots only when it has to.
    """

    def __init__(self, run_id: str = "", job: str = "", params: dict | None = None, status: str = "queued"):
        self.run_id = run_id
        self.job = job
        self.params: dict = dict(params or {})
        self.status = status
        self.runtime: dict = {}
        self.started: float | None = None
        self.finished: float | None = None
        self.summary: dict = {}
        self.error: str | None = None
        self.traceback: str | None = None
        self.problems: list[str] = []
        self.progress: dict[str, ProgressState] = {}
        self.stages = StageTimeline()
        self.tracks: dict[tuple[str, str, str], MetricTrack] = {}
        self.families: dict[str, list[MetricTrack]] = {}
        self.family_versions: dict[str, int] = {}
        self.final_metrics: dict[str, float] = {}
        self._routes: dict[tuple, tuple[MetricTrack, str]] = {}
        self.path: DecimatedSeries | None = None
        self._path_pending: dict[int, dict[str, float]] = {}
        self.replicas: dict[str, ReplicaValues] = {}
        self.latest_numeric_replica: str | None = None
        self.tables: dict[str, Table] = {}
        self.table_versions: dict[str, int] = {}
        self.logs: deque[tuple[str, str]] = deque(maxlen=MAX_LOG_LINES)
        self.logs_total = 0
        self.artifacts: list[Artifact] = []
        self.telemetry: dict[str, DecimatedSeries] = {}
        """Telemetry plot lines by label: (seconds since the run started, percent)."""
        self.telemetry_recent: deque[tuple[float, Telemetry]] = deque(maxlen=RECENT_TELEMETRY)
        self.telemetry_unavailable: dict[str, str] = {}
        """Why a telemetry source gave nothing, as of the newest sample."""
        self.telemetry_version = 0
        self.events_seen = 0
        self.version = 0
        self.plot_version = 0
        self.replica_version = 0

    @classmethod
    def from_events(cls, events: Iterable[tuple[float | None, Event]], **info: Any) -> RunModel:
        model = cls(**info)
        for stamp, event in events:
            model.apply(event, stamp)
        return model

    @property
    def finished_state(self) -> bool:
        return self.status in ("done", "failed", "cancelled", "interrupted")

    def elapsed(self, now: float | None = None) -> float | None:
        if self.started is None:
            return None
        end = self.finished if self.finished is not None else (now if now is not None else time.time())
        return max(0.0, end - self.started)

    def apply_all(self, events: Iterable[tuple[float | None, Event]]) -> None:
        for stamp, event in events:
            self.apply(event, stamp)

    def apply(self, event: Event, stamp: float | None = None) -> None:
        now = stamp if stamp is not None else time.time()
        self.events_seen += 1
        self.version += 1
        if isinstance(event, Metric):
            self._metric(event)
        elif isinstance(event, Progress):
            self._progress(event, now)
        elif isinstance(event, Stage):
            self.stages.apply(event, now)
        elif isinstance(event, Log):
            self.logs.append((event.level, event.text))
            self.logs_total += 1
        elif isinstance(event, ReplicaValues):
            self.replicas[event.name] = event
            if event.values and all(is_finite_number(value) for value in event.values):
                self.latest_numeric_replica = event.name
            self.replica_version += 1
        elif isinstance(event, Table):
            self.tables[event.title] = event
            self.table_versions[event.title] = self.table_versions.get(event.title, 0) + 1
        elif isinstance(event, Artifact):
            self.artifacts.append(event)
        elif isinstance(event, Telemetry):
            self._telemetry(event, now)
        elif isinstance(event, RunStarted):
            self.run_id, self.job, self.params = event.run_id or self.run_id, event.job, dict(event.params)
            self.runtime = dict(event.runtime or {})
            self.started = event.time
            self.status = "running"
        elif isinstance(event, RunFinished):
            self.status = event.status
            self.summary = dict(event.summary or {})
            self.error, self.traceback = event.error, event.traceback
            self.finished = now
            self.stages.end(now)
            if self.started is None:
                self.started = now

    def _metric(self, metric: Metric) -> None:
        # Training emits thousands of metrics a second: route each (name, split,
        # has-epoch) once, then only append.
        route_key = (metric.name, metric.split, metric.epoch is None)
        route = self._routes.get(route_key)
        if route is None:
            route = self._routes[route_key] = self._route(metric)
        track, final_name = route
        value = metric.value
        if not is_finite_number(value):
            value = math.nan
        if track.family in PATH_FAMILIES:
            self._path_point(track.family, metric)
        track.series.append(metric.step, value)
        if track.ema is not None and track.smoothed is not None and value == value:
            track.smoothed.append(metric.step, track.ema.update(value))
        track.last, track.last_step = value, metric.step
        track.count += 1
        self.family_versions[track.family] += 1
        self.plot_version += 1
        self.final_metrics[final_name] = value

    def _route(self, metric: Metric) -> tuple[MetricTrack, str]:
        family, split, granularity = classify_metric(metric)
        key = (family, split, granularity)
        track = self.tracks.get(key)
        if track is None:
            track = MetricTrack(family, split, granularity)
            if granularity == "batch":
                track.smoothed, track.ema = DecimatedSeries(), Ema()
            self.tracks[key] = track
            self.families.setdefault(family, []).append(track)
            self.family_versions.setdefault(family, 0)
        return track, metric.final_name

    def _path_point(self, family: str, metric: Metric) -> None:
        pending = self._path_pending.setdefault(metric.step, {})
        pending[family] = float(metric.value) if is_finite_number(metric.value) else math.nan
        if len(pending) == len(PATH_FAMILIES):
            if self.path is None:
                self.path = DecimatedSeries()
            self.path.append(pending[PATH_FAMILIES[0]], pending[PATH_FAMILIES[1]])
            del self._path_pending[metric.step]
        # Only the newest steps can still be completed; keep the dict small.
        if len(self._path_pending) > 8:
            for step in sorted(self._path_pending)[:-8]:
                del self._path_pending[step]

    def _telemetry(self, sample: Telemetry, stamp: float) -> None:
        summary = summarize(sample)
        seconds = stamp - self.started if self.started is not None else 0.0
        for label, field_name in TELEMETRY_LINES:
            value = getattr(summary, field_name)
            if value is not None:
                series = self.telemetry.get(label)
                if series is None:
                    series = self.telemetry[label] = DecimatedSeries()
                series.append(seconds, value)
        self.telemetry_recent.append((stamp, sample))
        self.telemetry_unavailable = dict(sample.unavailable)
        self.telemetry_version += 1
        self.plot_version += 1

    def idle_accelerator_hint(self, now: float | None = None) -> str | None:
        """Advice when the TPU idles while this run trains (live, metrics flowing); else None."""
        if self.status != "running" or not self.tracks:
            return None
        return idle_accelerator_hint(self.telemetry_recent, time.time() if now is None else now)

    def _progress(self, event: Progress, now: float) -> None:
        state = self.progress.get(event.unit)
        if state is None or event.done < state.done:
            self.progress[event.unit] = ProgressState(event.unit, event.done, event.total, now, event.done, now)
        else:
            state.done, state.total, state.last_time = event.done, event.total, now

    def stage_line(self, now: float | None = None) -> str | None:
        """See ``StageTimeline.line``."""
        return self.stages.line(time.time() if now is None else now, self.finished_state)

    def outcome_line(self) -> str | None:
        """What the run concluded: the summary's ``line`` if it has one, else its last info log."""
        line = self.summary.get("line")
        if isinstance(line, str) and line:
            return line
        return next((text for level, text in reversed(self.logs) if level == "info"), None)

    def last_metrics(self) -> dict[str, float]:
        """The newest value of every metric, named like run.json's final_metrics (``val_loss``)."""
        return dict(self.final_metrics)

    def device_results(self) -> dict[str, dict]:
        """Per device of a matmul check: ``passed`` and ``gflops``, read from the job's summary
        (its ``gflops`` per device and its ``failed_devices``); empty for any other run."""
        gflops = self.summary.get("gflops")
        if self.job != "matmul" or not isinstance(gflops, dict):
            return {}
        failed = set(self.summary.get("failed_devices") or ())
        return {
            str(device): {"passed": device not in failed, "gflops": float(value)}
            for device, value in gflops.items()
            if is_finite_number(value)
        }
