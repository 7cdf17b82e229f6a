"""What a run's telemetry samples say: named values for export, and the idle-TPU hint.

A sample is a ``jobs.events.Telemetry`` event that an observer
(``tpudash.telemetry``) appended to a run's telemetry.jsonl. Reading it is
part of reading a run: the export flattens it into named numbers, and the
run view warns when the TPU idled while the run trained. Its few summary
numbers are ``tpudash.telemetry_summary`` (a leaf the CLI's tables use too).
The samplers may import this module, never the other way round.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jobs.events import Telemetry, is_finite_number
from tpudash.telemetry_summary import summarize

# The accelerator counts as mostly idle below this mean duty cycle, over at
# least IDLE_MIN_SAMPLES samples within IDLE_WINDOW_SECONDS.
IDLE_DUTY_CYCLE_PCT = 50.0
IDLE_WINDOW_SECONDS = 30.0
IDLE_MIN_SAMPLES = 5
INPUT_BOUND_ADVICE = (
    "the input pipeline is the likely bottleneck: end it with .prefetch(tf.data.AUTOTUNE), map with "
    "num_parallel_calls=tf.data.AUTOTUNE, .cache() a dataset that fits in memory, and raise "
    "steps_per_execution in compile() (Cloud TPU performance guide; TensorFlow's tf.data performance guide)"
)


def finite_or_none(value: Any) -> float | None:
    """``value`` as a float when it is a finite number, else None (a source that measured nothing)."""
    return float(value) if is_finite_number(value) else None


def idle_accelerator_hint(
    samples: Iterable[tuple[float, Telemetry]], now: float, window: float = IDLE_WINDOW_SECONDS
) -> str | None:
    """Advice when the TPU was mostly idle over the last ``window`` seconds of samples, else None.

    Call it only while a run is training: an idle TPU between runs is expected.
    """
    duties = [
        summary.duty_cycle_pct
        for stamp, sample in samples
        if now - stamp <= window
        for summary in (summarize(sample),)
        if summary.duty_cycle_pct is not None
    ]
    if len(duties) < IDLE_MIN_SAMPLES:
        return None
    mean = sum(duties) / len(duties)
    if mean >= IDLE_DUTY_CYCLE_PCT:
        return None
    return f"the TPU was busy {mean:.0f}% of the last {window:.0f} s while training: {INPUT_BOUND_ADVICE}"


def scalars(sample: Telemetry) -> dict[str, float]:
    """A sample as named numbers, for CSV export and plots: ``tpu0_duty_cycle_pct``, ``host_cpu_pct``…"""
    values: dict[str, float] = {}
    for chip in sample.chips:
        for key in ("duty_cycle_pct", "hbm_used", "hbm_total", "hbm_bandwidth_pct", "tensorcore_util_pct"):
            value = finite_or_none(chip.get(key))
            if value is not None:
                values[f"tpu{chip.get('chip')}_{key}"] = value
    summary = summarize(sample)
    if summary.cpu_pct is not None:
        values["host_cpu_pct"] = summary.cpu_pct
    for key in ("memory_used", "memory_total"):
        value = finite_or_none(sample.host.get(key))
        if value is not None:
            values[f"host_{key}"] = value
    for label, rss in (sample.host.get("processes") or {}).items():
        if is_finite_number(rss):
            values[f"{label}_rss"] = float(rss)
    return values
