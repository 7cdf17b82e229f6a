"""The device check: every logical device multiplies the same seeded matrices.

Each chosen device computes A(m×k)·B(k×n) under ``tf.device``; the result is
compared with a float64 NumPy reference under a tolerance that depends on the
dtype and on k, and the multiply is timed (warm-up, then ``repeats`` timed
runs whose median gives ms and GFLOP/s). A device that computes a wrong
product fails the run and is named, after the per-device table is out.

On a TPU the job also says how much of the 128×128 matrix unit (MXU) the
padding of each dimension wastes (seed 001: one dimension is padded to a
multiple of 8, another to a multiple of 128).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from jobs.base import JobSpec, Param, ParamError
from jobs.events import ReplicaValues, Table

DTYPES = ("float32", "bfloat16", "float16")
MAX_DIMENSION = 8192
# Rows of A (and of the product) are padded to a multiple of this on a TPU...
TPU_ROW_TILE = 8
# ...while the contracted dimension k and the output columns n fill the
# 128-wide MXU (seed 001).
TPU_MXU_TILE = 128
# Matrices up to this size are printed in the log: small enough to read.
PRINTED_SHAPE_LIMIT = 8

# Unit roundoff (half the machine epsilon) of each dtype's significand:
# 24 bits for float32, 8 for bfloat16, 11 for float16.
UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
# Every backend accumulates these matmuls in float32 (TPU MXU, oneDNN/Eigen,
# cuBLAS with fp32 compute); the product is then rounded to the dtype.
ACCUMULATION_ROUNDOFF = 2.0**-24
# Float32 matmuls on accelerators round their *inputs* when TensorFloat-32 is
# enabled (TF's default): to bfloat16 on a TPU's MXU, to TF32 (10-bit
# mantissa) on an Ampere+ GPU.
REDUCED_FLOAT32_INPUT_ROUNDOFF = {"TPU": 2.0**-8, "GPU": 2.0**-11}
# NumPy's BLAS threads keep spinning for about 0.1 s after the reference is
# computed and halve the speed of whatever runs next on a small CPU, so the
# first device keeps warming up at least this long before it is timed.
BLAS_SETTLE_SECONDS = 0.25
# OpenBLAS multiplies on one thread (no spinning helpers) below this m·k·n.
BLAS_THREADED_WORK = 65536 * 4
# Head-room over the error model; on this CPU the worst relative errors seen
# are at most a sixth of the resulting tolerance for every dtype.
TOLERANCE_SAFETY = 4.0


class CheckFailed(RuntimeError):
    """A device or replica computed a wrong result; the run is recorded as failed.

    ``summary`` holds the check's summary (which devices failed, errors,
    timings) for a runner that keeps the summary of a failed run.
    """

    def __init__(self, message: str, summary: dict):
        super().__init__(message)
        self.summary = summary


def relative_tolerance(dtype: str, k: int, reduced_float32_input_roundoff: float = 0.0) -> float:
    """Largest allowed max|C − C_ref| / max|C_ref| for a correct device.

    The product is rounded once to ``dtype`` (one unit roundoff); accumulating
    k float32 terms adds a random-walk error that grows like sqrt(k); float32
    inputs rounded by TensorFloat-32 add their own roundoff. The reference is
    built from the inputs already rounded to ``dtype``, so input rounding to
    bfloat16/float16 is not an error.
    """
    input_roundoff = reduced_float32_input_roundoff if dtype == "float32" else 0.0
    model = UNIT_ROUNDOFF[dtype] + input_roundoff + math.sqrt(k) * ACCUMULATION_ROUNDOFF
    return TOLERANCE_SAFETY * model


def padding_warnings(m: int, k: int, n: int) -> list[str]:
    """What a TPU's MXU wastes on A(m×k)·B(k×n): one line per badly sized dimension.

    The rows m are padded to a multiple of 8; k and n to multiples of 128
    (seed 001). The last line gives the share of the padded multiply that is
    padding, when any dimension needed it.
    """
    tiles = (("m", m, TPU_ROW_TILE), ("k", k, TPU_MXU_TILE), ("n", n, TPU_MXU_TILE))
    lines = []
    padded_volume = 1
    for name, size, tile in tiles:
        padded = math.ceil(size / tile) * tile
        padded_volume *= padded
        if padded != size:
            wasted = 1 - size / padded
            lines.append(
                f"{name}={size} is not a multiple of {tile}: the TPU pads it to {padded}, "
                f"so {wasted:.1%} of the MXU work along {name} is padding"
            )
    if lines:
        wasted_total = 1 - (m * k * n) / padded_volume
        lines.append(
            f"in all {wasted_total:.1%} of the padded {m}×{k}·{k}×{n} multiply is wasted; "
            f"use m a multiple of {TPU_ROW_TILE} and k, n multiples of {TPU_MXU_TILE}"
        )
    return lines


def parse_device_selection(text: str) -> tuple[int, ...] | None:
    """``"all"`` → None; ``"0,2,5-7"`` → (0, 2, 5, 6, 7). ValueError says what is wrong."""
    text = text.strip().lower()
    if text == "all":
        return None
    indices: list[int] = []
    for part in text.split(","):
        part = part.strip()
        first, dash, last = part.partition("-")
        try:
            if dash:
                start, stop = int(first, 10), int(last, 10)
                if start > stop:
                    raise ValueError
                indices.extend(range(start, stop + 1))
            else:
                indices.append(int(part, 10))
        except ValueError:
            raise ValueError(f"{part!r} is not a device index or range like 0-3") from None
    for index in indices:
        if index < 0:
            raise ValueError(f"device index {index} is negative")
    duplicates = sorted({index for index in indices if indices.count(index) > 1})
    if duplicates:
        raise ValueError(f"device {duplicates[0]} is listed twice")
    return tuple(indices)


def _check_device_selection(text: str) -> str | None:
    try:
        parse_device_selection(text)
    except ValueError as error:
        return f"{error}; allowed: all, or comma-separated device indices and ranges such as 0,2,4-7"
    return None


def format_matrix(matrix: Any) -> str:
    """A small matrix as nested lists; whole numbers without a decimal point."""
    rows = []
    for row in matrix:
        cells = []
        for value in row:
            value = float(value)
            cells.append(str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.6g}")
        rows.append("[" + ", ".join(cells) + "]")
    return "[" + ", ".join(rows) + "]"


def _check_runtime(params: dict, runtime: Any) -> None:
    count = len(runtime.logical_devices)
    selection = parse_device_selection(params["devices"])
    chosen = range(count) if selection is None else selection
    for index in chosen:
        if index >= count:
            raise ParamError("devices", f"device {index} is out of range; this session has {count} devices (0-{count - 1})")
    if params["inject_error"] and params["inject_device"] not in chosen:
        raise ParamError(
            "inject_device",
            f"{params['inject_device']} is not among the devices checked ({params['devices']})",
        )


def _reduced_float32_input_roundoff(tf: Any, kind: str) -> float:
    if kind not in REDUCED_FLOAT32_INPUT_ROUNDOFF:
        return 0.0
    if not tf.config.experimental.tensor_float_32_execution_enabled():
        return 0.0
    return REDUCED_FLOAT32_INPUT_ROUNDOFF[kind]


def _device_suffix(device_name: str) -> str:
    """``/job:localhost/replica:0/task:0/device:CPU:3`` → ``CPU:3``."""
    return device_name.rpartition("device:")[2]


def _median_seconds(multiply, a, b, warmup: int, repeats: int, settle_seconds: float = 0.0):
    """Median wall time of ``multiply(a, b)``, each run forced to finish.

    Reading one element of the product back to the host cannot happen
    before the whole multiply is done, on any device, and costs next to
    nothing; the product of the last run is returned for the check. The
    warm-up runs ``warmup`` times and for at least ``settle_seconds``.
    """
    product = None
    warmed_up = 0
    settle_until = time.perf_counter() + settle_seconds
    while warmed_up < warmup or time.perf_counter() < settle_until:
        product = multiply(a, b)
        product[:1, :1].numpy()
        warmed_up += 1
    durations = []
    for _ in range(repeats):
        started = time.perf_counter()
        product = multiply(a, b)
        product[:1, :1].numpy()
        durations.append(time.perf_counter() - started)
    return statistics.median(durations), product


def _check_device(tf: Any, multiply, name: str, inputs: tuple, expected: Any, scale: float,
                  tolerance: float, params: dict, settle_seconds: float = 0.0) -> dict:
    """Time the multiply on device ``name`` and compare its product with ``expected``."""
    import numpy as np

    with tf.device(name):
        device_a, device_b = (tf.identity(matrix) for matrix in inputs)
        seconds, product = _median_seconds(
            multiply, device_a, device_b, params["warmup"], params["repeats"], settle_seconds
        )
    result = product.numpy().astype(np.float64)
    max_abs_error = float(np.max(np.abs(result - expected)))
    relative_error = max_abs_error / scale
    flops = 2.0 * params["m"] * params["k"] * params["n"]
    return {
        "device": name,
        "placed_on": product.device,
        "product": result,
        # NaN compares False: a device that produces NaN fails.
        "passed": bool(relative_error <= tolerance),
        "max_abs_error": max_abs_error,
        "relative_error": relative_error,
        "median_ms": seconds * 1e3,
        "gflops": flops / seconds / 1e9,
    }


def run(ctx, params: dict) -> dict:
    import numpy as np
    import tensorflow as tf

    runtime = ctx.runtime
    m, k, n, dtype = params["m"], params["k"], params["n"], params["dtype"]
    selection = parse_device_selection(params["devices"])
    all_devices = list(runtime.logical_devices)
    chosen = list(range(len(all_devices))) if selection is None else list(selection)

    if runtime.kind == "TPU":
        for line in padding_warnings(m, k, n):
            ctx.log(line, "warning")
    reduced_roundoff = _reduced_float32_input_roundoff(tf, runtime.kind)
    if dtype == "float32" and reduced_roundoff:
        ctx.log(
            f"TensorFloat-32 is enabled: float32 matmuls on this {runtime.kind} round their inputs, "
            "so the tolerance allows for it (tf.config.experimental.enable_tensor_float_32_execution(False) "
            "gives full float32)",
        )
    tolerance = relative_tolerance(dtype, k, reduced_roundoff)

    generator = np.random.default_rng(params["seed"])
    host_a = tf.cast(tf.constant(generator.standard_normal((m, k), dtype=np.float32)), dtype)
    host_b = tf.cast(tf.constant(generator.standard_normal((k, n), dtype=np.float32)), dtype)
    # The reference multiplies exactly the values the devices get.
    reference = tf.cast(host_a, tf.float64).numpy() @ tf.cast(host_b, tf.float64).numpy()
    scale = max(float(np.max(np.abs(reference))), np.finfo(np.float64).tiny)
    multiply = tf.function(tf.matmul)

    ctx.progress(0, len(chosen), "device")
    results: list[dict] = []
    for position, index in enumerate(chosen):
        if ctx.cancelled():
            ctx.log(f"cancelled after {len(results)} of {len(chosen)} devices", "warning")
            _emit_table(ctx, results, params, tolerance)
            ctx.raise_if_cancelled()
        name = all_devices[index].name
        expected = reference
        if params["inject_error"] and index == params["inject_device"]:
            # Self-test: a wrong reference must make this device fail.
            expected = reference.copy()
            expected[0, 0] += params["inject_error"] * scale
        settle_seconds = BLAS_SETTLE_SECONDS if position == 0 and m * k * n >= BLAS_THREADED_WORK else 0.0
        outcome = _check_device(tf, multiply, name, (host_a, host_b), expected, scale, tolerance, params, settle_seconds)
        results.append(outcome)
        if outcome["placed_on"] and _device_suffix(outcome["placed_on"]) != _device_suffix(name):
            ctx.log(f"{name}: the product was placed on {outcome['placed_on']}, not on the device asked for", "warning")
        if m <= PRINTED_SHAPE_LIMIT and n <= PRINTED_SHAPE_LIMIT:
            ctx.log(f"{name}: {format_matrix(outcome['product'])}")
        verdict = "pass" if outcome["passed"] else "FAIL"
        ctx.log(
            f"{name}: {verdict}, relative error {outcome['relative_error']:.3g} "
            f"({'within' if outcome['passed'] else 'exceeds'} the {dtype} tolerance {tolerance:.3g}), "
            f"{outcome['median_ms']:.3f} ms, {outcome['gflops']:.2f} GFLOP/s",
            "info" if outcome["passed"] else "error",
        )
        ctx.progress(position + 1, len(chosen), "device")

    _emit_table(ctx, results, params, tolerance)
    summary = _summary(results, params, tolerance)
    ctx.emit(ReplicaValues(name="gflops", values=[row["gflops"] for row in results], devices=[row["device"] for row in results]))
    if summary["failed_devices"]:
        failed = ", ".join(summary["failed_devices"])
        ctx.log(f"matmul check failed on {failed}", "error")
        raise CheckFailed(f"matmul check failed on {failed}", summary)
    ctx.log(
        f"all {len(results)} devices passed; {summary['fastest_device']} fastest at "
        f"{summary['gflops'][summary['fastest_device']]:.1f} GFLOP/s, spread {summary['spread']:.1%}"
    )
    return summary


def _emit_table(ctx, results: list[dict], params: dict, tolerance: float) -> None:
    """The per-device table: error, pass/fail, median time, GFLOP/s."""
    if not results:
        return
    m, k, n = params["m"], params["k"], params["n"]
    rows = [
        [row["device"], float(f"{row['max_abs_error']:.3g}"), float(f"{row['relative_error']:.3g}"),
         float(f"{tolerance:.3g}"), "pass" if row["passed"] else "FAIL", round(row["median_ms"], 3),
         round(row["gflops"], 2)]
        for row in results
    ]
    ctx.emit(Table(
        title=f"matmul check: {m}×{k}·{k}×{n} {params['dtype']}, median of {params['repeats']}",
        columns=["device", "max abs error", "relative error", "tolerance", "result", "median ms", "GFLOP/s"],
        rows=rows,
    ))


def _summary(results: list[dict], params: dict, tolerance: float) -> dict:
    fastest = max(results, key=lambda row: row["gflops"])
    slowest = min(results, key=lambda row: row["gflops"])
    return {
        "all_passed": all(row["passed"] for row in results),
        "failed_devices": [row["device"] for row in results if not row["passed"]],
        "shape": [params["m"], params["k"], params["n"]],
        "dtype": params["dtype"],
        "tolerance": tolerance,
        "max_relative_error": max(row["relative_error"] for row in results),
        "fastest_device": fastest["device"],
        "slowest_device": slowest["device"],
        # How much slower the slowest device is than the fastest, as a fraction.
        "spread": (fastest["gflops"] - slowest["gflops"]) / fastest["gflops"],
        "gflops": {row["device"]: row["gflops"] for row in results},
        "median_ms": {row["device"]: row["median_ms"] for row in results},
    }


def _dimension(name: str, default: int, what: str) -> Param:
    return Param(name, "int", default, what, minimum=1, maximum=MAX_DIMENSION)


SPECS = (
    JobSpec(
        name="matmul",
        title="Matmul check",
        description=(
            "Every logical device multiplies the same seeded A(m×k)·B(k×n); each product is checked "
            "against a float64 NumPy reference and timed (median ms, GFLOP/s). A wrong device fails the run."
        ),
        params=(
            _dimension("m", 1024, "rows of A and of the product"),
            _dimension("k", 1024, "columns of A, rows of B (the summed dimension)"),
            _dimension("n", 1024, "columns of B and of the product"),
            Param("dtype", "str", "float32", "element type of A and B", choices=DTYPES),
            Param("repeats", "int", 5, "timed multiplies per device; the median is reported", minimum=1, maximum=1000),
            Param("warmup", "int", 1, "untimed multiplies per device first (tracing, caches); the first device "
                  "also warms up for 0.25 s after a large NumPy reference", minimum=0, maximum=100),
            Param("seed", "int", 0, "seed of the random matrices", minimum=0, maximum=2**31 - 1),
            Param("devices", "str", "all", "which devices: all, or indices and ranges such as 0,2,4-7",
                  check=_check_device_selection),
            Param("inject_error", "float", 0.0,
                  "self-test: corrupt one reference element by this fraction of the product's largest "
                  "magnitude; anything above the tolerance must make inject_device fail", minimum=0.0),
            Param("inject_device", "int", 0, "the device whose reference inject_error corrupts", minimum=0),
        ),
        run=run,
        key="m",
        check_runtime=_check_runtime,
    ),
)
