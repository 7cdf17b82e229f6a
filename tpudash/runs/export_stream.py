"""A run's CSV export written as its events are read: memory bounded by a piece of its stream, not by the run.

``export.export_run`` builds the CSV from a list of every event; a run of a
million events holds them all (hundreds of MB) before the first row is
written. ``write_run_csv`` writes the same rows, in the same order (the
metric points, then a row per telemetry value), to a text file as the
run's streams are folded (``tail.fold_events``): ``tpudash export`` writes
through it straight into its output, and ``RunStore.export`` into a string.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import IO, Protocol

from jobs.events import Event, Metric, Telemetry
from tpudash.runs.export import CSV_COLUMNS
from tpudash.runs.layout import EVENTS_STREAM, TELEMETRY_STREAM
from tpudash.runs.tail import EventSource, fold_events
from tpudash.runs.telemetry_samples import scalars


class StreamsOfRuns(Protocol):
    """What the export reads a run from: a ``store.RunStore`` (its ``find`` and ``stream``)."""

    def find(self, run_id: str) -> Path | str: ...

    def stream(self, run_id: str, stream: str = EVENTS_STREAM, *, follow: bool = False) -> EventSource: ...


def write_run_csv(store: StreamsOfRuns, run_id: str, out: IO[str]) -> list[str]:
    """Write run ``run_id``'s metrics and telemetry to ``out`` as CSV; what could not be read.

    Raises KeyError (from ``find``) before writing anything when there is no such run.
    """
    found = str(store.find(run_id)).rstrip("/").rsplit("/", 1)[-1]
    return write_csv(store.stream(found), store.stream(found, TELEMETRY_STREAM), out)


def write_csv(events: EventSource, telemetry: EventSource, out: IO[str]) -> list[str]:
    """The rows of ``export.export_run``'s CSV, written as ``events`` and then ``telemetry`` are read."""
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()

    def metric_row(stamp: float | None, event: Event) -> None:
        if isinstance(event, Metric):
            writer.writerow(
                {
                    "time": stamp,
                    "name": event.name,
                    "split": event.split,
                    "step": event.step,
                    "epoch": event.epoch,
                    "value": event.value,
                }
            )

    sample_number = 0

    def telemetry_rows(stamp: float | None, sample: Event) -> None:
        nonlocal sample_number
        number, sample_number = sample_number, sample_number + 1  # every event of the stream counts, as there
        if isinstance(sample, Telemetry):
            for name, value in scalars(sample).items():
                writer.writerow(
                    {"time": stamp, "name": name, "split": "telemetry", "step": number, "epoch": None, "value": value}
                )

    problems = fold_events(events, metric_row)
    return problems + fold_events(telemetry, telemetry_rows)


def run_csv(store: StreamsOfRuns, run_id: str) -> str:
    """``write_run_csv`` into a string (``RunStore.export``): the CSV's text is held, the run's events never."""
    buffer = io.StringIO()
    write_run_csv(store, run_id, buffer)
    return buffer.getvalue()
