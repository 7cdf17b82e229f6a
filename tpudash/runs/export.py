"""A run's metrics and telemetry as CSV or JSON: what ``tpudash export`` and History's export write.

In CSV a metric point is a row; a telemetry sample is a row per value
(``tpu0_duty_cycle_pct``, ``host_cpu_pct``…) with split ``telemetry`` and
the sample's number as its step. JSON has the run's record, the metric rows
and the samples whole under ``telemetry``.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

from jobs.events import Event, Metric, Telemetry, event_to_dict
from tpudash.runs.telemetry_samples import scalars

EXPORT_FORMATS = ("csv", "json")
CSV_COLUMNS = ["time", "name", "split", "step", "epoch", "value"]


def export_run(
    run: dict[str, Any],
    metrics: Sequence[tuple[float | None, Metric]],
    telemetry: Sequence[tuple[float | None, Event]],
    fmt: str = "csv",
) -> str:
    """``run`` (a ``RunInfo.to_dict()``), its metric points and telemetry samples in ``fmt`` (csv or json)."""
    rows: list[dict[str, Any]] = [
        {
            "time": stamp,
            "name": metric.name,
            "split": metric.split,
            "step": metric.step,
            "epoch": metric.epoch,
            "value": metric.value,
        }
        for stamp, metric in metrics
    ]
    if fmt == "json":
        samples = [{"time": stamp, **event_to_dict(sample)} for stamp, sample in telemetry]
        return json.dumps({"run": run, "metrics": rows, "telemetry": samples}, indent=2)
    if fmt != "csv":
        raise ValueError(f"format: {fmt!r} is not allowed; allowed: {', '.join(EXPORT_FORMATS)}")
    rows += [
        {"time": stamp, "name": name, "split": "telemetry", "step": number, "epoch": None, "value": value}
        for number, (stamp, sample) in enumerate(telemetry)
        if isinstance(sample, Telemetry)
        for name, value in scalars(sample).items()
    ]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
