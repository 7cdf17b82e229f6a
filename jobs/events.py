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
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Optional, TypeGuard, Union, get_args

import msgspec

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
    """A JSON object that is not one of the protocol's events, or one whose fields break its rules."""


# What a reader accepts (events.jsonl comes from any writer: each field is checked once, where it is read).
MAX_COUNT = 2**53
"""Steps, epochs and counts are whole numbers in 0 … 2**53 (beyond, JSON readers lose precision)."""
MAX_NAME_CHARS = 256
"""Names, units, statuses, kinds: one short line."""
MAX_TEXT_CHARS = 1 << 20
"""Log text, errors, tracebacks, paths: no more than a line of events.jsonl may hold."""
MAX_NODES = 100_000
"""Values in one dict or list field, counted through every level."""
MAX_DEPTH = 32
"""Nesting of dict and list fields: a matrix of replica values is three deep."""
# Timestamps as time.localtime and datetime accept them in any time zone: 1970 to 9999-12-30 UTC.
MIN_TIMESTAMP = 0.0
MAX_TIMESTAMP = 253_402_128_000.0
# Fields that hold prose rather than a name: the long cap applies.
TEXT_FIELDS = {"text", "error", "traceback", "path"}
# A telemetry chip's and host's numbers (``Telemetry``): a number, or None where a source does not report it.
CHIP_NUMBERS = ("chip", "duty_cycle_pct", "hbm_used", "hbm_total", "hbm_bandwidth_pct", "tensorcore_util_pct")
HOST_NUMBERS = ("memory_used", "memory_total")


def is_sane_timestamp(value: Any) -> bool:
    """A unix time every formatter accepts: a finite number between 1970 and 9999."""
    return is_finite_number(value) and MIN_TIMESTAMP <= value <= MAX_TIMESTAMP


def describe(value: Any) -> str:
    """A refused value as an error message quotes it: its type, and the start of its text."""
    if isinstance(value, (dict, list)):
        return f"a {'JSON object' if isinstance(value, dict) else 'list'} of {len(value)}"
    return f"{value!r:.40}"


def json_size(value: Any, allowed_depth: int = MAX_DEPTH) -> int:
    """How many values ``value`` holds through every level; ValueError past ``allowed_depth`` levels."""
    if isinstance(value, (dict, list)):
        if allowed_depth <= 0:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        items = value.values() if isinstance(value, dict) else value
        return 1 + sum(json_size(item, allowed_depth - 1) for item in items)
    return 1


def _check_number(value: Any) -> bool:
    # NaN and infinity are values a run can report (a diverged loss): they must show, not vanish.
    return isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool))


def _check_container(value: Any) -> bool:
    try:
        return json_size(value) <= MAX_NODES
    except ValueError:
        return False


def _check_table(event: Any) -> tuple[str, str] | None:
    if not all(isinstance(column, str) and len(column) <= MAX_NAME_CHARS for column in event.columns):
        return "columns", f"a list of column names (text of at most {MAX_NAME_CHARS} characters)"
    if not all(isinstance(row, list) for row in event.rows):
        return "rows", "a list of rows, each a list of cells"
    return None


def _check_replica_values(event: Any) -> tuple[str, str] | None:
    if len(event.values) != len(event.devices):
        return "devices", f"one device per value ({len(event.values)} values, {len(event.devices)} devices)"
    if not all(isinstance(device, str) and len(device) <= MAX_NAME_CHARS for device in event.devices):
        return "devices", f"a list of device names (text of at most {MAX_NAME_CHARS} characters)"
    return None


def _check_log(event: Any) -> tuple[str, str] | None:
    return None if event.level in LOG_LEVELS else ("level", f"one of {', '.join(LOG_LEVELS)}")


def _is_number_or_none(value: Any) -> bool:
    return value is None or _check_number(value)


def _check_telemetry(event: Any) -> tuple[str, str] | None:
    for chip in event.chips:
        if not isinstance(chip, dict) or not all(_is_number_or_none(chip.get(key)) for key in CHIP_NUMBERS):
            return "chips", f"a list of chips, each a JSON object whose {', '.join(CHIP_NUMBERS)} are numbers or null"
    host = event.host
    if not all(_is_number_or_none(host.get(key)) for key in HOST_NUMBERS):
        return "host", f"a JSON object whose {', '.join(HOST_NUMBERS)} are numbers or null"
    if not isinstance(host.get("cpu_pct") or [], list) or not isinstance(host.get("processes") or {}, dict):
        return "host", "a JSON object whose cpu_pct is a list and processes a JSON object"
    if not all(isinstance(reason, str) for reason in event.unavailable.values()):
        return "unavailable", "a JSON object of source names to reasons (text)"
    return None


# Rules across fields, after every field has its type: (field, what is allowed), or None.
EVENT_RULES: dict[str, Callable[[Any], tuple[str, str] | None]] = {
    Table.type: _check_table,
    ReplicaValues.type: _check_replica_values,
    Log.type: _check_log,
    Telemetry.type: _check_telemetry,
}

# -- reading: msgspec decodes and checks each field's type and range in one pass -----------------------
# Measured on a 100,000-event file (tests/benchmarks/bench_event_parse.py): json.loads plus the same checks
# in plain Python took 4 × as long. The field types below are the rules; a refusal is explained in words.
_COUNT = Annotated[int, msgspec.Meta(ge=0, lt=MAX_COUNT)]
_NAME = Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)]
_TEXT = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_CHARS)]
_STAMP = Annotated[float, msgspec.Meta(ge=MIN_TIMESTAMP, le=MAX_TIMESTAMP)]
_CONTAINER_RULE = f"of at most {MAX_NODES} values, {MAX_DEPTH} levels deep"
# Each annotation of the event dataclasses as (wire type, what a refusal says is allowed).
_WIRE_TYPES: dict[str, tuple[Any, str]] = {
    "int": (_COUNT, "a whole number from 0 to 2**53"),
    "float": (float, "a number"),
    "str": (_NAME, f"text of at most {MAX_NAME_CHARS} characters"),
    "dict": (dict, f"a JSON object {_CONTAINER_RULE}"),
    "list": (list, f"a list {_CONTAINER_RULE}"),
}
_TEXT_RULE = (_TEXT, f"text of at most {MAX_TEXT_CHARS} characters")
_STAMP_RULE = (_STAMP, "a unix time (1970 to 9999)")


def _wire_field(name: str, hint: str) -> tuple[Any, str]:
    optional = hint.endswith(" | None")
    base = hint.removesuffix(" | None")
    if base not in _WIRE_TYPES:  # a new field type must get its rule here
        raise TypeError(f"no reader rule for a field of type {hint}")
    wire, allowed = _TEXT_RULE if name in TEXT_FIELDS else _STAMP_RULE if name == "time" else _WIRE_TYPES[base]
    return (Optional[wire], f"{allowed} or null") if optional else (wire, allowed)  # noqa: UP045 - a runtime value


@dataclass(frozen=True)
class _EventReader:
    """How one event type is read: its wire Struct (the dataclass's fields plus ``t``), checked as decoded."""

    cls: type
    wire: type
    names: tuple[str, ...]
    allowed: dict[str, str]
    containers: tuple[str, ...]


def _event_reader(cls: type) -> _EventReader:
    fields: list[tuple[Any, ...]] = []
    allowed: dict[str, str] = {}
    for item in dataclasses.fields(cls):
        wire, allowed[item.name] = _wire_field(item.name, str(item.type))
        if item.default is not dataclasses.MISSING:
            fields.append((item.name, wire, item.default))
        elif item.default_factory is not dataclasses.MISSING:
            fields.append((item.name, wire, msgspec.field(default_factory=item.default_factory)))
        else:
            fields.append((item.name, wire))
    wire_t, _ = _wire_field("time", "float | None")
    fields.append(("t", wire_t, None))
    allowed["t"] = _STAMP_RULE[1]  # may be absent or null: when present, a time the views can format
    struct = msgspec.defstruct(f"{cls.__name__}Line", fields, tag=cls.type, tag_field="type")  # type: ignore[attr-defined]
    names = tuple(item.name for item in dataclasses.fields(cls))
    containers = tuple(
        item.name for item in dataclasses.fields(cls) if str(item.type).split(" ")[0] in ("dict", "list")
    )
    return _EventReader(cls, struct, names, allowed, containers)


_READERS: dict[type, _EventReader] = {}
for _cls in get_args(Event):
    _reader = _event_reader(_cls)
    _READERS[_reader.wire] = _reader
_WIRE_UNION: Any = Union[tuple(_READERS)]  # noqa: UP007 - a runtime value
_LINE_DECODER = msgspec.json.Decoder(_WIRE_UNION)


def _event_from_wire(wire: Any) -> tuple[float | None, Event]:
    reader = _READERS[type(wire)]
    event = reader.cls(*[getattr(wire, name) for name in reader.names])
    for name in reader.containers:
        if not _check_container(getattr(event, name)):
            raise UnknownEventError(f"{event.type} event: {name} must be {reader.allowed[name]}")
    rule = EVENT_RULES.get(event.type)
    broken = rule(event) if rule is not None else None
    if broken is not None:
        raise UnknownEventError(f"{event.type} event: {broken[0]} must be {broken[1]}")
    return wire.t, event


def _refusal(payload: dict, error: msgspec.ValidationError) -> UnknownEventError:
    """msgspec's reason in words: the event type, the field and what it may hold."""
    kind = payload.get("type")
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return UnknownEventError(f"unknown event type {describe(kind)}; known: {', '.join(EVENT_TYPES)}")
    message = str(error)
    missing = re.match(r"Object missing required field `(\w+)`", message)
    if missing:
        return UnknownEventError(f"{cls.type} event: {missing.group(1)} is missing")
    where = re.search(r" - at `\$\.(\w+)", message)
    allowed = _READERS_BY_TYPE[cls.type].allowed
    if where is None or where.group(1) not in allowed:
        return UnknownEventError(f"{cls.type} event: {message}")
    name = where.group(1)
    return UnknownEventError(f"{cls.type} event: {name} must be {allowed[name]}, not {describe(payload.get(name))}")


_READERS_BY_TYPE = {reader.cls.type: reader for reader in _READERS.values()}  # type: ignore[attr-defined]


def event_from_dict(payload: dict) -> Event:
    """Rebuild an event from ``event_to_dict`` output, every field checked; extra keys are ignored.

    UnknownEventError (a ValueError) names the event type, the field and
    what it may hold. Numbers a field declares as float come back as floats.
    """
    return _timed_event_from_dict(payload)[1]


def _timed_event_from_dict(payload: Any) -> tuple[float | None, Event]:
    if not isinstance(payload, dict):
        raise UnknownEventError(f"not an event object: {describe(payload)}")
    try:
        wire = msgspec.convert(payload, _WIRE_UNION)
    except msgspec.ValidationError as error:
        raise _refusal(payload, error) from None
    return _event_from_wire(wire)


def decode_event_line(line: str | bytes) -> tuple[float | None, Event]:
    """One line of events.jsonl as (timestamp ``t`` or None, event); ValueError names what is wrong with it.

    The fast path decodes and checks in one pass. A line it refuses is read
    again with ``json``, which also reads the NaN and Infinity that Python
    writes for a diverged loss, and checked field by field for the reason.
    """
    try:
        return _event_from_wire(_LINE_DECODER.decode(line))
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    try:
        payload = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("truncated or not JSON") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    return _timed_event_from_dict(payload)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
"""Each event class's field names, in order: looked up once (a training writes several events a step)."""
_PLAIN = (str, bool, int, float, type(None))
# One encoder for every line: ``json.dumps`` with separators builds a new one per call.
_LINE_ENCODER = json.JSONEncoder(separators=(",", ":"))


def event_to_dict(event: Event, timestamp: float | None = None) -> dict:
    """The JSON object for ``event``; ``timestamp`` is stored as ``t``."""
    payload: dict[str, Any] = {"type": event.type}
    if timestamp is not None:
        payload["t"] = round(timestamp, 6)
    names = _FIELD_NAMES.get(type(event))
    if names is None:
        names = _FIELD_NAMES[type(event)] = tuple(item.name for item in dataclasses.fields(event))
    for name in names:
        value = getattr(event, name)
        # Exact types only: a bool subclass, a numpy float or an int enum goes through to_jsonable.
        payload[name] = value if type(value) in _PLAIN else to_jsonable(value)
    return payload


def dumps(event: Event, timestamp: float | None = None) -> str:
    """One JSON line (no newline) for ``event``; NaN/inf stay readable by Python."""
    return _LINE_ENCODER.encode(event_to_dict(event, timestamp))


def loads(line: str | bytes) -> Event:
    """Parse one line written by ``dumps``."""
    return decode_event_line(line)[1]


def is_finite_number(value: Any) -> TypeGuard[float]:
    """True for a real number that is neither NaN nor infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
