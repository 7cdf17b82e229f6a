"""MFU beside examples/s: the accelerator's peak, and FLOPs per step × steps per second ÷ that peak.

No TensorFlow or JAX here (the CLI and the dashboard may import this
module; ``tpudash.advice.flops`` counts the FLOPs in the training process).

- On a TPU the peak is the published bf16 peak of one chip of its
  generation (``TPU_PEAKS``, each with the Google Cloud page it comes from)
  × the chips the run uses: ``tpu_peak_flops``.
- On a CPU or a GPU it is what the matmul check (``jobs/matmul.py``)
  measured on that host, labelled so: ``measured_peak_flops``.
- ``mfu`` divides; ``Mfu`` carries the figure with where its peak and its
  FLOPs come from, for run.json (``mfu``, ``peak_source``).

A peak or a count that cannot be had is never a silent zero: its value is
None and its ``source`` says why.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PeakFlops:
    """The accelerator's peak in FLOP/s, or None; ``source`` says where it comes from, or why there is none."""

    flops_per_second: float | None
    source: str

    @property
    def known(self) -> bool:
        return self.flops_per_second is not None


@dataclass(frozen=True)
class TpuPeak:
    """One TPU generation's published dense bf16 peak per chip."""

    generation: str
    flops_per_chip: float
    published: str
    """The figure as the page prints it."""
    url: str
    devices_per_chip: int
    """How many devices JAX and TensorFlow show per chip: 2 on v2 and v3 (a device per TensorCore), else 1."""


# The published bf16 peak per chip, from Google Cloud's TPU system architecture
# pages (each generation's page, "Peak compute per chip"), as read on 2026-11-28:
#   v3  https://cloud.google.com/tpu/docs/v3        "123 teraflops (bf16)"
#   v4  https://cloud.google.com/tpu/docs/v4        "275 teraflops (bf16 or int8)"
#   v5e https://cloud.google.com/tpu/docs/v5e       "197 TFLOPs" (bf16)
#   v5p https://cloud.google.com/tpu/docs/v5p       "459 TFLOPs" (bf16)
#   v6e https://cloud.google.com/tpu/docs/v6e       "918 TFLOPs" (bf16)
# v2 has no such page any more. Its 45 TFLOPS per chip is Google's Cloud TPU v2
# board (180 teraflops for 4 chips), as cited by the v2 benchmark paper
# (https://arxiv.org/abs/1907.10701, Wang, Wei and Brooks) and by PyTorch
# Lightning's throughput table; the figure is the same for bf16 and f32 inputs,
# as the matrix unit multiplies in bf16.
TPU_PEAKS: dict[str, TpuPeak] = {
    "v2": TpuPeak("v2", 45e12, "45 TFLOPS (180 per 4-chip board)", "https://arxiv.org/abs/1907.10701", 2),
    "v3": TpuPeak("v3", 123e12, "123 teraflops (bf16)", "https://cloud.google.com/tpu/docs/v3", 2),
    "v4": TpuPeak("v4", 275e12, "275 teraflops (bf16 or int8)", "https://cloud.google.com/tpu/docs/v4", 1),
    "v5e": TpuPeak("v5e", 197e12, "197 TFLOPs (bf16)", "https://cloud.google.com/tpu/docs/v5e", 1),
    "v5p": TpuPeak("v5p", 459e12, "459 TFLOPs (bf16)", "https://cloud.google.com/tpu/docs/v5p", 1),
    "v6e": TpuPeak("v6e", 918e12, "918 TFLOPs (bf16)", "https://cloud.google.com/tpu/docs/v6e", 1),
}

# How tpudash meets a TPU's name: JAX's device_kind ("TPU v4", "TPU v5 lite",
# "TPU v5" for a v5p, "TPU v6 lite"), tpu-info's chip type ("TPU v5e chip",
# tpudash.accel.hostcheck.Chips.chip_type), and the accelerator types of
# Cloud's API ("v5litepod-8", "v6e-8", "v3-8"). Lower-cased, "tpu" and "chip"
# dropped, then matched whole.
_KIND_ALIASES = {
    "v2": "v2",
    "v3": "v3",
    "v4": "v4",
    "v5 lite": "v5e",
    "v5lite": "v5e",
    "v5litepod": "v5e",
    "v5e": "v5e",
    "v5": "v5p",
    "v5p": "v5p",
    "v6 lite": "v6e",
    "v6e": "v6e",
}
_KIND_NOISE = re.compile(r"\btpu\b|\bchip\b|-\d+$")


def tpu_generation(device_kind: str | None) -> str | None:
    """``"v5e"`` for ``"TPU v5 lite"``, ``"TPU v5e chip"`` or ``"v5litepod-8"``; None for anything else."""
    if not isinstance(device_kind, str):
        return None
    name = _KIND_NOISE.sub(" ", device_kind.strip().lower())
    name = " ".join(name.split())
    return _KIND_ALIASES.get(name)


def tpu_chips(device_kind: str | None, devices: int) -> int:
    """The chips behind ``devices`` TPU devices: v2 and v3 show one device per TensorCore, two per chip."""
    generation = tpu_generation(device_kind)
    per_chip = TPU_PEAKS[generation].devices_per_chip if generation else 1
    return max(1, math.ceil(devices / per_chip))


def tpu_peak_flops(device_kind: str | None, chips: int) -> PeakFlops:
    """The published bf16 peak of ``chips`` chips of this TPU; unknown (None, with why) for another kind."""
    generation = tpu_generation(device_kind)
    if generation is None:
        known = ", ".join(TPU_PEAKS)
        return PeakFlops(None, f"no published peak for {device_kind!r}: tpudash knows TPU {known}")
    if not isinstance(chips, int) or isinstance(chips, bool) or chips < 1:
        return PeakFlops(None, f"the chip count {chips!r} is not a positive number")
    peak = TPU_PEAKS[generation]
    chips_text = f"{chips} chip{'s' if chips != 1 else ''}"
    return PeakFlops(
        peak.flops_per_chip * chips,
        f"TPU {generation} published bf16 peak, {peak.published} per chip × {chips_text} ({peak.url})",
    )


# -- the peak the matmul check measured ------------------------------------------------------------


def measured_peak_flops(source: Any, *, host: str | None = None) -> PeakFlops:
    """The FLOP/s the matmul check measured: from a run store (its newest check), one run, or a device check.

    ``source`` is a ``RunStore`` (its newest finished matmul run on ``host``
    when given, any host otherwise), a ``RunInfo`` or its ``to_dict()``
    (run.json as read), or the dashboard's device check
    (``RunsOnDisk.last_device_check``: ``{"run_id", "finished", "results":
    {device: {"passed", "gflops"}}}``). Only devices that computed the right
    product count. Logical CPU devices share the host's cores, and the check
    times one device at a time, so the host's peak is the fastest of them;
    GPUs (and TPU cores) are separate chips, so theirs add up.
    """
    if hasattr(source, "list_runs"):
        return _newest_check(source, host)
    record = _as_record(source)
    if record is None:
        return PeakFlops(None, f"not a matmul check: {type(source).__name__}")
    return _peak_of_check(record)


def _newest_check(store: Any, host: str | None) -> PeakFlops:
    try:
        infos = store.list_runs()
    except Exception as error:  # noqa: BLE001 - an unreadable runs directory: said, never raised
        return PeakFlops(None, f"the runs could not be listed: {type(error).__name__}: {error}")
    where = f" on host {host}" if host else ""
    for info in reversed(infos):  # oldest first: the newest check wins
        if getattr(info, "job", None) != "matmul" or getattr(info, "status", None) not in ("done", "failed"):
            continue
        if host is not None and getattr(info, "host", None) not in (host, None):
            continue
        peak = measured_peak_flops(info)
        if peak.known:
            return peak
    return PeakFlops(None, f"no matmul check in the runs directory{where}: run `tpudash run matmul` once")


def _as_record(source: Any) -> dict | None:
    """What a check is read from, as one dict: run_id, finished, and per-device GFLOP/s with pass/fail."""
    if isinstance(source, Mapping):
        data: Mapping = source
    elif hasattr(source, "summary") and hasattr(source, "run_id"):
        data = {name: getattr(source, name, None) for name in ("run_id", "job", "finished", "started", "summary")}
    else:
        return None
    results = data.get("results")
    if not isinstance(results, Mapping):
        summary = data.get("summary")
        if not isinstance(summary, Mapping) or not isinstance(summary.get("gflops"), Mapping):
            return None
        failed = set(summary.get("failed_devices") or ())
        results = {
            device: {"passed": device not in failed, "gflops": value} for device, value in summary["gflops"].items()
        }
    when = data.get("finished") if data.get("finished") is not None else data.get("started")
    return {"run_id": str(data.get("run_id") or "?"), "finished": when, "results": results}


def _finite_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _peak_of_check(record: dict) -> PeakFlops:
    run_id = record["run_id"]
    passed = {
        str(device): float(row["gflops"])
        for device, row in record["results"].items()
        if isinstance(row, Mapping) and row.get("passed") and _finite_positive(row.get("gflops"))
    }
    if not passed:
        return PeakFlops(None, f"the matmul check {run_id} has no device that passed with a GFLOP/s figure")
    when = record["finished"]
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(when)) if _finite_positive(when) else "undated"
    cpus = [device for device in passed if _device_type(device) == "CPU"]
    if len(cpus) == len(passed):
        fastest = max(passed, key=passed.__getitem__)
        how = (
            f"the fastest of {len(passed)} logical CPU devices, which share the host's cores"
            if len(passed) > 1
            else "one CPU device"
        )
        flops = passed[fastest] * 1e9
    else:
        flops = sum(passed.values()) * 1e9
        how = f"the sum over {len(passed)} devices"
    return PeakFlops(flops, f"measured by the matmul check of {run_id}, {date}: {flops / 1e9:,.1f} GFLOP/s, {how}")


def _device_type(name: str) -> str:
    """``CPU`` for ``/job:localhost/replica:0/task:0/device:CPU:3`` (or JAX's ``TFRT_CPU_3``), ``GPU``, ``TPU``; else ``?``."""
    match = re.search(r"(CPU|GPU|TPU)(?:[:_]\d+)?$", name, re.IGNORECASE)
    return match.group(1).upper() if match else "?"


# -- MFU -------------------------------------------------------------------------------------------


def mfu(flops_per_step: float, steps_per_second: float, peak: PeakFlops | float) -> float:
    """Model FLOPs utilisation: ``flops_per_step × steps_per_second ÷ peak`` (a fraction; 0.25 is 25 %).

    ``flops_per_step`` and ``peak`` must describe the same devices (the whole
    step on all of them, the peak of all of them). Raises ValueError for an
    unknown peak or a count that is not a positive finite number.
    """
    peak_value = peak.flops_per_second if isinstance(peak, PeakFlops) else peak
    if peak_value is None:
        raise ValueError(f"the peak is unknown: {peak.source if isinstance(peak, PeakFlops) else 'None'}")
    for name, value in (("flops_per_step", flops_per_step), ("peak", peak_value)):
        if not _finite_positive(value):
            raise ValueError(f"{name} must be a positive finite number, not {value!r}")
    if not (isinstance(steps_per_second, (int, float)) and math.isfinite(steps_per_second) and steps_per_second >= 0):
        raise ValueError(f"steps_per_second must be a non-negative finite number, not {steps_per_second!r}")
    return float(flops_per_step) * float(steps_per_second) / float(peak_value)


@dataclass(frozen=True)
class Mfu:
    """One run's MFU with where its parts come from; what run.json keeps (``mfu``, ``peak_source``)."""

    mfu: float | None
    """A fraction (0.25 is 25 %); None when it cannot be had (``why`` says)."""
    peak_source: str
    flops_source: str
    flops_per_step: float | None = None
    steps_per_second: float | None = None
    peak_flops_per_second: float | None = None
    why: str = ""
    """Empty when ``mfu`` is known; else what was missing."""

    @classmethod
    def of(cls, flops: Any, steps_per_second: float | None, peak: PeakFlops) -> Mfu:
        """From a FLOPs count (``flops.FlopsCount``: ``.flops``, ``.source``), steps/s and a peak; never raises."""
        flops_per_step = getattr(flops, "flops", None)
        flops_source = str(getattr(flops, "source", ""))
        missing = []
        if flops_per_step is None:
            missing.append(f"FLOPs per step unknown: {flops_source}")
        if not peak.known:
            missing.append(f"peak unknown: {peak.source}")
        if steps_per_second is None:
            missing.append("no steps timed yet")
        value = None
        if not missing:
            try:
                value = mfu(flops_per_step, steps_per_second, peak)  # type: ignore[arg-type]
            except ValueError as error:
                missing.append(str(error))
        return cls(
            mfu=value,
            peak_source=peak.source,
            flops_source=flops_source,
            flops_per_step=flops_per_step,
            steps_per_second=steps_per_second,
            peak_flops_per_second=peak.flops_per_second,
            why="; ".join(missing),
        )

    def text(self) -> str:
        """``MFU 12.3 %`` or ``MFU unknown (peak unknown: ...)``: what a header or a table shows."""
        if self.mfu is None:
            return f"MFU unknown ({self.why})" if self.why else "MFU unknown"
        return f"MFU {self.mfu * 100:.3g} %"

    def to_json(self) -> dict[str, Any]:
        return {
            "mfu": self.mfu,
            "peak_source": self.peak_source,
            "flops_source": self.flops_source,
            "flops_per_step": self.flops_per_step,
            "steps_per_second": self.steps_per_second,
            "peak_flops_per_second": self.peak_flops_per_second,
            "why": self.why,
        }

    @classmethod
    def from_json(cls, data: Any) -> Mfu:
        """Read back from run.json; untrusted input, so every field is checked (ValueError names the field)."""
        if not isinstance(data, Mapping):
            raise ValueError("mfu must be an object")
        numbers = {}
        for name in ("mfu", "flops_per_step", "steps_per_second", "peak_flops_per_second"):
            value = data.get(name)
            if value is not None and not (
                isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
            ):
                raise ValueError(f"{name} must be a non-negative number or null, not {value!r}")
            numbers[name] = None if value is None else float(value)
        texts = {}
        for name in ("peak_source", "flops_source", "why"):
            value = data.get(name, "")
            if not isinstance(value, str):
                raise ValueError(f"{name} must be a string")
            texts[name] = value[:500]
        return cls(
            mfu=numbers["mfu"],
            peak_source=texts["peak_source"],
            flops_source=texts["flops_source"],
            flops_per_step=numbers["flops_per_step"],
            steps_per_second=numbers["steps_per_second"],
            peak_flops_per_second=numbers["peak_flops_per_second"],
            why=texts["why"],
        )


def known_kinds() -> Iterable[str]:
    """The TPU names tpudash maps to a generation (for help text and tests)."""
    return tuple(_KIND_ALIASES)
