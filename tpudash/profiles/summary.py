"""A profile's summary (``summary.json`` beside its capture), read back checked; a run's captures listed.

``summary.json`` is written by the converter (``xprof_child``) and read by the
CLI, the dashboard and ``tpudash serve``. It lives in the run, so it is
untrusted input: ``ProfileSummary.from_json`` checks every field's type,
range and length, and a bad field is a ValueError naming it. Nested parts
stay plain JSON (dicts and lists) of a checked shape: ``to_json()`` is what
``tpudash profile --json`` prints.

A run's captures are the folders of ``profile/plugins/profile/`` (XProf's and
TensorBoard's layout), each with one ``<host>.xplane.pb`` per host.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from tpudash.profiles.requests import CAPTURES_FOLDER, PLAIN_NAME_RULE, is_plain_name
from tpudash.runs.backends import RunFiles

SUMMARY_VERSION = 1
SUMMARY_FILE = "summary.json"
XPLANE_SUFFIX = ".xplane.pb"
MAX_SUMMARY_BYTES = 4 * 1024 * 1024
MAX_TEXT = 4000
MAX_NAME = 500
MAX_LIST = 64
MAX_PER_STEP = 1000
MAX_MS = 1e12
VERDICTS = ("input-bound", "not input-bound", "unknown")
FRAMEWORKS = ("tensorflow", "jax", "unknown")
BREAKDOWN_KEYS = ("input", "host_compute", "device_compute", "collectives", "compile", "other", "idle")
PER_STEP_TIMES = (
    "total_ms",
    "input_ms",
    "host_compute_ms",
    "device_compute_ms",
    "collectives_ms",
    "compile_ms",
    "other_ms",
)
STEP_TIME_KEYS = ("avg", "min", "max", "std")
UTILISATION_KEYS = ("duty_cycle", "mxu", "flop_rate_vs_roofline", "memory_bandwidth")
# A capture folder's name as TensorFlow and JAX give it: the local time the profile stopped.
CAPTURE_NAME_FORMAT = "%Y_%m_%d_%H_%M_%S"


class ProfileError(Exception):
    """A profile could not be read or converted; ``str(error)`` is the one sentence the user reads."""


@dataclass(frozen=True)
class ProfileSummary:
    """What XProf says about one capture, in the shape of ``summary.json`` (see the module's docstring)."""

    capture: str
    hosts: list[str]
    framework: str
    hardware: str
    steps: int
    step_time_ms: dict[str, float | None]
    per_step: list[dict[str, Any]]
    breakdown: dict[str, float]
    input_percent: float | None
    verdict: str
    input_conclusion: str
    bottleneck: str
    recommendations: list[str]
    utilisation: dict[str, dict[str, Any]]
    top_ops: list[dict[str, Any]]
    top_ops_source: str
    input_stages: list[dict[str, Any]]
    notes: list[str]
    tool: str
    convert_seconds: float
    version: int = SUMMARY_VERSION

    def to_json(self) -> dict[str, Any]:
        """``summary.json``'s object (version first, as the file shows it)."""
        payload = asdict(self)
        return {"version": payload.pop("version"), **payload}

    @classmethod
    def from_json(cls, payload: object) -> ProfileSummary:
        """A summary from untrusted JSON; ValueError naming the first field that is wrong."""
        if not isinstance(payload, dict):
            raise ValueError(f"summary: {type(payload).__name__} is not a JSON object")
        version = payload.get("version")
        if not _is_whole(version) or version != SUMMARY_VERSION:
            raise ValueError(f"version: {version!r:.40} is not {SUMMARY_VERSION} (a summary this tpudash reads)")
        capture = payload.get("capture")
        if not is_plain_name(capture):
            raise ValueError(f"capture: {capture!r:.40} is not {PLAIN_NAME_RULE}")
        return cls(
            capture=str(capture),
            hosts=_list(payload, "hosts", lambda value, where: _text(value, where, MAX_NAME, empty=False)),
            framework=_choice(payload, "framework", FRAMEWORKS),
            hardware=_text(payload.get("hardware"), "hardware", MAX_NAME),
            steps=_whole(payload, "steps", 0, 10**9),
            step_time_ms=_step_time(payload.get("step_time_ms")),
            per_step=_list(payload, "per_step", _per_step, limit=MAX_PER_STEP),
            breakdown=_breakdown(payload.get("breakdown")),
            input_percent=_number(payload.get("input_percent"), "input_percent", 0.0, 100.0, optional=True),
            verdict=_choice(payload, "verdict", VERDICTS),
            input_conclusion=_text(payload.get("input_conclusion"), "input_conclusion", MAX_TEXT),
            bottleneck=_text(payload.get("bottleneck"), "bottleneck", MAX_TEXT),
            recommendations=_list(payload, "recommendations", lambda value, where: _text(value, where, MAX_TEXT)),
            utilisation=_utilisation(payload.get("utilisation")),
            top_ops=_list(payload, "top_ops", _top_op),
            top_ops_source=_text(payload.get("top_ops_source"), "top_ops_source", MAX_NAME),
            input_stages=_list(payload, "input_stages", _input_stage),
            notes=_list(payload, "notes", lambda value, where: _text(value, where, MAX_TEXT)),
            tool=_text(payload.get("tool"), "tool", MAX_NAME),
            convert_seconds=_number(payload.get("convert_seconds"), "convert_seconds", 0.0, 1e7),
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> ProfileSummary:
        """A summary from ``summary.json``'s bytes; ValueError when they are not JSON or a field is wrong."""
        try:
            payload = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as error:
            raise ValueError(f"summary: not JSON ({str(error)[:120]})") from None
        return cls.from_json(payload)


@dataclass(frozen=True)
class CaptureInfo:
    """One capture of a run, as a listing shows it."""

    name: str
    """The capture's folder, ``profile/plugins/profile/<name>/``."""
    hosts: list[str]
    """One per ``<host>.xplane.pb`` in it."""
    has_summary: bool
    started_at: float | None
    """Unix time the capture's name gives (the local time TensorFlow or JAX named it by); None when it gives none."""


def capture_folder(capture: str) -> str:
    """The run-relative folder of ``capture``; ValueError unless it is a plain name (never a path)."""
    if not is_plain_name(capture):
        raise ValueError(f"capture: {capture!r:.40} is not {PLAIN_NAME_RULE}")
    return f"{CAPTURES_FOLDER}/{capture}"


def list_captures(files: RunFiles) -> list[CaptureInfo]:
    """The run's captures, newest first; folders that are not plain names are left out."""
    found: dict[str, set[str]] = {}
    local = files.local_dir
    if local is not None:
        # One scan of the captures' folder instead of a walk of the whole run (its events, its telemetry).
        try:
            with os.scandir(local / CAPTURES_FOLDER) as scan:
                names = [entry.name for entry in scan if entry.is_dir(follow_symlinks=False)]
        except OSError:
            names = []
        for name in names:
            if is_plain_name(name):
                found[name] = set(files.list(f"{CAPTURES_FOLDER}/{name}"))
    else:
        prefix = CAPTURES_FOLDER + "/"
        for path in files.walk():
            if not path.startswith(prefix):
                continue
            name, _, rest = path[len(prefix) :].partition("/")
            if is_plain_name(name) and rest and "/" not in rest:
                found.setdefault(name, set()).add(rest)
    captures = [
        CaptureInfo(
            name=name,
            hosts=sorted(entry[: -len(XPLANE_SUFFIX)] for entry in entries if entry.endswith(XPLANE_SUFFIX)),
            has_summary=SUMMARY_FILE in entries,
            started_at=capture_time(name),
        )
        for name, entries in found.items()
    ]
    captures.sort(key=lambda info: (info.started_at or 0.0, info.name), reverse=True)
    return captures


def capture_time(name: str) -> float | None:
    """The unix time a capture's folder name gives (``2026_11_28_07_05_54``, local time); None for another name."""
    try:
        return time.mktime(time.strptime(name, CAPTURE_NAME_FORMAT))
    except (ValueError, OverflowError):
        return None


def read_summary(files: RunFiles, capture: str) -> ProfileSummary | None:
    """The capture's ``summary.json``, checked; None when there is none yet; ProfileError when it is unreadable."""
    name = f"{capture_folder(capture)}/{SUMMARY_FILE}"
    try:
        data = files.read(name, MAX_SUMMARY_BYTES)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ProfileError(f"the summary of capture {capture} could not be read: {error}") from None
    try:
        return ProfileSummary.from_bytes(data)
    except ValueError as error:
        raise ProfileError(f"the summary of capture {capture} is not one tpudash reads: {error}") from None


# -- checks -------------------------------------------------------------------------------


def _is_whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _text(value: object, where: str, limit: int, *, empty: bool = True) -> str:
    if not isinstance(value, str) or len(value) > limit or (not empty and not value):
        least = 0 if empty else 1
        raise ValueError(f"{where}: {value!r:.40} is not text of {least} to {limit} characters")
    return value


def _number(value: object, where: str, low: float, high: float, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not _is_number(value) or not low <= float(value) <= high:  # type: ignore[arg-type]
        raise ValueError(f"{where}: {value!r:.40} is not a number from {low:g} to {high:g}")
    return float(value)  # type: ignore[arg-type]


def _whole(payload: dict, where: str, low: int, high: int) -> int:
    value = payload.get(where)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{where}: {value!r:.40} is not a whole number from {low} to {high}")
    return value


def _choice(payload: dict, where: str, allowed: tuple[str, ...]) -> str:
    value = payload.get(where)
    if value not in allowed:
        raise ValueError(f"{where}: {value!r:.40} is not one of {', '.join(allowed)}")
    return str(value)


def _list(payload: dict, where: str, check: Any, *, limit: int = MAX_LIST) -> list:
    value = payload.get(where)
    if not isinstance(value, list) or len(value) > limit:
        raise ValueError(f"{where}: not a list of at most {limit} items")
    return [check(item, f"{where}[{index}]") for index, item in enumerate(value)]


def _object(value: object, where: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: {type(value).__name__} is not a JSON object")
    return value


def _step_time(value: object) -> dict[str, float | None]:
    times = _object(value, "step_time_ms")
    return {key: _number(times.get(key), f"step_time_ms.{key}", 0.0, MAX_MS, optional=True) for key in STEP_TIME_KEYS}


def _per_step(value: object, where: str) -> dict[str, Any]:
    step = _object(value, where)
    checked: dict[str, Any] = {"step": _text(step.get("step"), f"{where}.step", MAX_NAME)}
    for key in PER_STEP_TIMES:
        checked[key] = _number(step.get(key), f"{where}.{key}", 0.0, MAX_MS)
    return checked


def _breakdown(value: object) -> dict[str, float]:
    parts = _object(value, "breakdown")
    return {key: _number(parts.get(key), f"breakdown.{key}", 0.0, 100.0) for key in BREAKDOWN_KEYS}


def _utilisation(value: object) -> dict[str, dict[str, Any]]:
    figures = _object(value, "utilisation")
    checked: dict[str, dict[str, Any]] = {}
    for key in UTILISATION_KEYS:
        figure = _object(figures.get(key), f"utilisation.{key}")
        note = figure.get("note")
        checked[key] = {
            "percent": _number(figure.get("percent"), f"utilisation.{key}.percent", 0.0, 100.0, optional=True),
            "note": None if note is None else _text(note, f"utilisation.{key}.note", MAX_NAME),
        }
    return checked


def _top_op(value: object, where: str) -> dict[str, Any]:
    op = _object(value, where)
    return {
        "name": _text(op.get("name"), f"{where}.name", MAX_NAME, empty=False),
        "type": _text(op.get("type"), f"{where}.type", MAX_NAME),
        "self_percent": _number(op.get("self_percent"), f"{where}.self_percent", 0.0, 100.0),
        "self_ms": _number(op.get("self_ms"), f"{where}.self_ms", 0.0, MAX_MS),
    }


def _input_stage(value: object, where: str) -> dict[str, Any]:
    stage = _object(value, where)
    return {
        "name": _text(stage.get("name"), f"{where}.name", MAX_NAME, empty=False),
        "self_ms": _number(stage.get("self_ms"), f"{where}.self_ms", 0.0, MAX_MS),
        "self_percent": _number(stage.get("self_percent"), f"{where}.self_percent", 0.0, 100.0),
    }
