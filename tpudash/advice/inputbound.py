"""The ``input-bound`` rule judged where a run is read: from its telemetry's duty cycle and its newest profile.

A run's writer cannot judge it (``live.INPUT_BOUND_WHY``): the duty cycle is
sampled by observers into the run's telemetry, and a profile is converted by
whoever asked for it. A reader has both, so it re-judges the rule with
``rules.input_bound`` and says where each input came from:

- the duty-cycle hint: the run's last ``telemetry_samples.IDLE_WINDOW_SECONDS``
  of samples judged as the run view's idle-TPU hint judges them
  (``telemetry_samples.idle_accelerator_hint``); only the tail of
  ``telemetry.jsonl`` is read (``TELEMETRY_TAIL_BYTES``), so a run of days
  costs what a run of a minute does; else what the writer said (a boolean
  ``duty_hint`` in the stored rule's detail), if anything;
- the input share: the newest capture with a summary
  (``tpudash.profiles.summary``, read capped as every summary is).

No TensorFlow, no Textual: the CLI (``tpudash advise``) and the dashboard may import it.
Nothing here raises: what cannot be read is said in the rule's detail.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, BinaryIO

from tpudash.advice.rules import Advice, input_bound
from tpudash.runs.layout import TELEMETRY_STREAM
from tpudash.runs.telemetry_samples import IDLE_MIN_SAMPLES, IDLE_WINDOW_SECONDS, idle_accelerator_hint

if TYPE_CHECKING:
    from jobs.events import Telemetry
    from tpudash.advice.report import AdviceReport
    from tpudash.runs.backends import RunFiles

RULE = "input-bound"
# The most of telemetry.jsonl read, from its end: a sample is ~0.3-2 KiB, so this holds minutes of them at
# one a second, more than the window judged.
TELEMETRY_TAIL_BYTES = 256 * 1024
# Samples kept from a run's telemetry segments (a store run without telemetry.jsonl), newest last.
MAX_SAMPLES_KEPT = 512


@dataclasses.dataclass(frozen=True)
class Reading:
    """One input of the rule: its value (None: nothing to judge by) and where it came from, or why there is none."""

    value: Any
    source: str


def with_input_bound(report: AdviceReport, files: RunFiles) -> AdviceReport:
    """``report`` with its ``input-bound`` rule judged from what the run holds now (telemetry, profiles)."""
    judged = judge_input_bound(files, report.rule(RULE))
    advice = tuple(judged if item.rule == RULE else item for item in report.advice)
    return dataclasses.replace(report, advice=advice)


def judge_input_bound(files: RunFiles, stored: Advice | None = None) -> Advice:
    """The rule from the run's duty-cycle hint and its newest profile's input share, each one's source in the detail."""
    duty = duty_hint(files)
    if duty.value is None and stored is not None and isinstance(stored.detail.get("duty_hint"), bool):
        duty = Reading(stored.detail["duty_hint"], "the run's writer (advice.json)")
    profile = profile_input_percent(files)
    judged = input_bound(duty.value, profile.value)
    detail = dict(judged.detail)
    detail.update(
        duty_hint=duty.value,
        duty_hint_source=duty.source,
        input_percent=profile.value if profile.value is None else round(float(profile.value), 1),
        input_percent_source=profile.source,
    )
    return dataclasses.replace(judged, detail=detail)


def duty_hint(files: RunFiles) -> Reading:
    """Whether the accelerator idled over the run's last samples (the run view's hint); None when it cannot be told."""
    try:
        samples = recent_samples(files)
    except Exception as error:  # noqa: BLE001 - a store's client raises its own types; the rule says why instead
        return Reading(None, f"telemetry unreadable: {type(error).__name__}: {str(error)[:200]}")
    if not samples:
        return Reading(None, "no telemetry recorded")
    newest = samples[-1][0]
    duties = [stamp for stamp, sample in samples if newest - stamp <= IDLE_WINDOW_SECONDS and _has_duty(sample)]
    if len(duties) < IDLE_MIN_SAMPLES:
        return Reading(
            None,
            f"telemetry has {len(duties)} duty-cycle samples in its last {IDLE_WINDOW_SECONDS:g} s "
            f"(a TPU's, {IDLE_MIN_SAMPLES} needed)",
        )
    hint = idle_accelerator_hint(samples, newest)
    said = hint.split(":", 1)[0] if hint else f"the TPU was busy over its last {IDLE_WINDOW_SECONDS:g} s"
    return Reading(hint is not None, f"telemetry: {said}")


def _has_duty(sample: Telemetry) -> bool:
    from tpudash.telemetry_summary import summarize

    return summarize(sample).duty_cycle_pct is not None


def recent_samples(files: RunFiles) -> list[tuple[float, Telemetry]]:
    """The run's newest telemetry samples, oldest first: the tail of telemetry.jsonl, else its segments' last ones."""
    name = f"{TELEMETRY_STREAM}.jsonl"
    try:
        handle = files.open(name)
    except FileNotFoundError:
        return _segment_samples(files)
    with handle:
        data, cut = _tail(handle)
    lines = data.split(b"\n")
    if cut:
        lines = lines[1:]  # begun before the tail read
    return _samples(lines)


def _tail(handle: BinaryIO) -> tuple[bytes, bool]:
    """The last ``TELEMETRY_TAIL_BYTES`` of an open file, and whether anything came before them.

    A file on disk (and most stores' files) seeks to them; an object read by bounded ranged requests
    (``storeclient``) cannot seek, so it is read through, only its tail kept.
    """
    if handle.seekable():
        size = handle.seek(0, 2)
        start = max(0, size - TELEMETRY_TAIL_BYTES)
        handle.seek(start)
        return handle.read(TELEMETRY_TAIL_BYTES), start > 0
    kept, total = b"", 0
    while chunk := handle.read(TELEMETRY_TAIL_BYTES):
        total += len(chunk)
        kept = (kept + chunk)[-TELEMETRY_TAIL_BYTES:]
    return kept, total > len(kept)


def _samples(lines: Iterable[bytes]) -> list[tuple[float, Telemetry]]:
    from jobs.events import Telemetry, decode_event_line

    samples = []
    for line in lines:
        if not line.strip():
            continue
        try:
            stamp, event = decode_event_line(line)
        except ValueError:  # a line being written, or one that is not a sample: the others judge
            continue
        if isinstance(event, Telemetry) and stamp is not None:
            samples.append((stamp, event))
    return samples


def _segment_samples(files: RunFiles) -> list[tuple[float, Telemetry]]:
    """A store run's telemetry in segments: read through, the newest ``MAX_SAMPLES_KEPT`` kept (memory bounded)."""
    from jobs.events import Telemetry
    from tpudash.runs.segments import StreamTail
    from tpudash.runs.tail import fold_events

    kept: deque[tuple[float, Telemetry]] = deque(maxlen=MAX_SAMPLES_KEPT)

    def keep(stamp: float | None, event: Any) -> None:
        if isinstance(event, Telemetry) and stamp is not None:
            kept.append((stamp, event))

    fold_events(StreamTail(files, TELEMETRY_STREAM, appends=False), keep)
    return sorted(kept, key=lambda item: item[0])


def profile_input_percent(files: RunFiles) -> Reading:
    """The input share of step time in the run's newest capture that has a summary; None when there is none."""
    from tpudash.profiles.summary import ProfileError, list_captures, read_summary

    try:
        captures = [capture for capture in list_captures(files) if capture.has_summary]
    except Exception as error:  # noqa: BLE001 - as above: said, never raised
        return Reading(None, f"profiles unreadable: {type(error).__name__}: {str(error)[:200]}")
    if not captures:
        return Reading(None, "no profile with a summary (tpudash profile RUN makes one)")
    newest = captures[0].name
    try:
        summary = read_summary(files, newest)
    except ProfileError as error:
        return Reading(None, str(error))
    except Exception as error:  # noqa: BLE001 - as above
        return Reading(None, f"profile {newest} unreadable: {type(error).__name__}: {str(error)[:200]}")
    if summary is None or summary.input_percent is None:
        return Reading(None, f"profile {newest} does not say the input's share")
    return Reading(summary.input_percent, f"profile {newest}: {summary.verdict}")
