"""The few numbers one telemetry sample comes to: mean duty cycle, HBM used, mean host CPU, host memory used.

A leaf beside ``tpudash.format``: the telemetry tables (``tpudash.format``),
the run model's telemetry plot (``tpudash.runs.model``) and the run export
all read a ``jobs.events.Telemetry`` sample through it, and it imports
nothing of tpudash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the event protocol (msgspec) loads after the dashboard's first frame
    from jobs.events import Telemetry


@dataclass(frozen=True)
class Summary:
    """The few numbers a plot line or a status line needs from one sample (None: not measured)."""

    duty_cycle_pct: float | None
    hbm_used_pct: float | None
    hbm_bandwidth_pct: float | None
    cpu_pct: float | None
    memory_used_pct: float | None


def summarize(sample: Telemetry) -> Summary:
    """Mean duty cycle over chips, HBM used of all chips' total, mean host CPU, host memory used."""
    from jobs.events import is_finite_number

    duties = [chip["duty_cycle_pct"] for chip in sample.chips if is_finite_number(chip.get("duty_cycle_pct"))]
    bandwidths = [chip["hbm_bandwidth_pct"] for chip in sample.chips if is_finite_number(chip.get("hbm_bandwidth_pct"))]
    used = sum(chip.get("hbm_used") or 0 for chip in sample.chips)
    total = sum(chip.get("hbm_total") or 0 for chip in sample.chips)
    cores = [value for value in sample.host.get("cpu_pct") or [] if is_finite_number(value)]
    memory_total = sample.host.get("memory_total") or 0
    return Summary(
        duty_cycle_pct=sum(duties) / len(duties) if duties else None,
        hbm_used_pct=100.0 * used / total if total else None,
        hbm_bandwidth_pct=sum(bandwidths) / len(bandwidths) if bandwidths else None,
        cpu_pct=sum(cores) / len(cores) if cores else None,
        memory_used_pct=100.0 * (sample.host.get("memory_used") or 0) / memory_total if memory_total else None,
    )
