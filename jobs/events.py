"""The event protocol every front end consumes.

Jobs talk to the world only through these events. Each is a frozen dataclass
that round-trips through JSON: ``event_to_dict`` adds a ``type`` tag (and the
wall-clock ``t`` at which it was emitted, when known), ``event_from_dict``
reads it back. One JSON object per line is the on-disk format of
``events.jsonl`` and the output of ``tpudash run --json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, get_args

LOG_LEVELS = ("debug", "info", "warning", "error")
SPLITS = ("train", "val", "test")
# The Stage that says a run's steps have begun: the stages before it were its preparation.
TRAINING_STAGE = "training"
# Counts within one stage (examples made, …) are worth a redraw, not a flood.
STAGE_COUNT_SECONDS = 0.25


def to_jsonable(value: Any) -> Any:
    """Turn numpy scalars/arrays, tuples and paths into plain JSON values."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(item) for item in value]
    # numpy and TensorFlow values, without importing either here.
    if hasattr(value, "numpy") and callable(value.numpy):
        value = value.numpy()
    if hasattr(value, "tolist") and callable(value.tolist):
        return to_jsonable(value.tolist())
    if hasattr(value, "item") and callable(value.item):
        return to_jsonable(value.item())
    return str(value)


@dataclass(frozen=True)
class RunStarted:
    """A run began: which job, with which (validated) params, on which runtime."""

    run_id: str
    job: str
    params: dict
    runtime: dict
    time: float
    type: ClassVar[str] = "run_started"


@dataclass(frozen=True)
class Log:
    """A line for the log pane; advice and warnings go here too."""

    level: str
    text: str
    type: ClassVar[str] = "log"


@dataclass(frozen=True)
class Progress:
    """``done`` of ``total`` units (steps, epochs, devices); total None if unknown."""

    done: int
    total: int | None
    unit: str
    type: ClassVar[str] = "progress"


@dataclass(frozen=True)
class Stage:
    """What the run is doing while no step reports progress: making the data, tracing…

    A stage lasts until the next one begins or the run ends; ``done`` of
    ``total`` when it counts something (examples made), else None. A job
    whose preparation takes a while names each part, and its last stage
    (``training``) says the steps have begun, so views can tell how long the
    run took to get going and where that time went.
    """

    name: str
    done: int | None = None
    total: int | None = None
    type: ClassVar[str] = "stage"


class StageAnnouncer:
    """Sends a job's ``Stage`` events through ``emit``: each stage once as it begins, and its
    counts at most every STAGE_COUNT_SECONDS (always the last), however often the job calls."""

    def __init__(self, emit: Callable[[Any], None]):
        self.emit = emit
        self.current: str | None = None
        """The name of the last stage announced, None before any."""
        self._sent = 0.0

    def __call__(self, name: str, done: int | None = None, total: int | None = None) -> None:
        now = time.monotonic()
        if name == self.current and (done is None or (done != total and now - self._sent < STAGE_COUNT_SECONDS)):
            return
        self.current, self._sent = name, now
        self.emit(Stage(name=name, done=done, total=total))


@dataclass(frozen=True)
class Metric:
    """One scalar: a loss, an accuracy, a throughput, a coordinate."""

    name: str
    value: float
    step: int
    epoch: int | None = None
    split: str = "train"
    type: ClassVar[str] = "metric"

    @property
    def final_name(self) -> str:
        """How run.json's final_metrics (and Keras's logs) name it: ``loss`` for train, ``val_loss`` for val."""
        return self.name if self.split == "train" else f"{self.split}_{self.name}"


# The splits a final-metric name (or a Keras log key) can carry as a prefix.
SPLIT_PREFIXES = ("val_", "test_")


def split_final_name(key: str) -> tuple[str, str]:
    """``val_loss`` → (``val``, ``loss``); ``loss`` → (``train``, ``loss``): ``Metric.final_name`` read back."""
    for prefix in SPLIT_PREFIXES:
        if key.startswith(prefix):
            return prefix[:-1], key[len(prefix) :]
    return "train", key


@dataclass(frozen=True)
class ReplicaValues:
    """One value per replica (number, list or matrix), with the device of each."""

    name: str
    values: list
    devices: list
    type: ClassVar[str] = "replica_values"


@dataclass(frozen=True)
class Table:
    """A result table, such as the per-device matmul check."""

    title: str
    columns: list
    rows: list
    type: ClassVar[str] = "table"


@dataclass(frozen=True)
class Artifact:
    """A file or directory the run produced: TensorBoard logdir, trace, export."""

    kind: str
    path: str
    type: ClassVar[str] = "artifact"


@dataclass(frozen=True)
class RunFinished:
    """The run ended: done, failed (with error and traceback) or cancelled."""

    status: str
    summary: dict = field(default_factory=dict)
    error: str | None = None
    traceback: str | None = None
    type: ClassVar[str] = "run_finished"


@dataclass(frozen=True)
class Telemetry:
    """One sample of the accelerator and the host beside a run (``tpudash.telemetry.sampling``).

    chips: per TPU chip ``{"chip", "duty_cycle_pct", "hbm_used", "hbm_total",
        "hbm_bandwidth_pct"}`` and ``"tensorcore_util_pct"`` where libtpu's SDK
        gives it (a value libtpu does not report is None or absent).
    host: ``{"cpu_pct": [per core], "memory_used", "memory_total",
        "processes": {label: resident bytes}}``.
    unavailable: per source (``tpu``, ``tensorcore``, ``host``) that gave nothing, the reason.

    Observers write these to a run's telemetry.jsonl, never to events.jsonl,
    which belongs to the run's own process.
    """

    chips: list
    host: dict
    unavailable: dict = field(default_factory=dict)
    type: ClassVar[str] = "telemetry"


Event = RunStarted | Log | Progress | Stage | Metric | ReplicaValues | Table | Artifact | RunFinished | Telemetry
EVENT_TYPES: dict[str, type[Event]] = {cls.type: cls for cls in get_args(Event)}


class UnknownEventError(ValueError):
    """A JSON object that is not one of the protocol's events."""


def event_to_dict(event: Event, timestamp: float | None = None) -> dict:
    """The JSON object for ``event``; ``timestamp`` is stored as ``t``."""
    payload: dict[str, Any] = {"type": event.type}
    if timestamp is not None:
        payload["t"] = round(timestamp, 6)
    for item in dataclasses.fields(event):
        payload[item.name] = to_jsonable(getattr(event, item.name))
    return payload


def event_from_dict(payload: dict) -> Event:
    """Rebuild an event from ``event_to_dict`` output; extra keys are ignored."""
    if not isinstance(payload, dict):
        raise UnknownEventError(f"not an event object: {payload!r:.80}")
    cls = EVENT_TYPES.get(str(payload.get("type")))
    if cls is None:
        raise UnknownEventError(f"unknown event type {payload.get('type')!r}")
    names = {item.name for item in dataclasses.fields(cls)}
    try:
        return cls(**{key: value for key, value in payload.items() if key in names})
    except TypeError as error:
        raise UnknownEventError(f"malformed {cls.type} event: {error}") from None


def dumps(event: Event, timestamp: float | None = None) -> str:
    """One JSON line (no newline) for ``event``; NaN/inf stay readable by Python."""
    return json.dumps(event_to_dict(event, timestamp), separators=(",", ":"))


def loads(line: str) -> Event:
    """Parse one line written by ``dumps``."""
    return event_from_dict(json.loads(line))


def is_finite_number(value: Any) -> bool:
    """True for a real number that is neither NaN nor infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
