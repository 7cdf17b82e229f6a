"""The device check: every logical device multiplies the same seeded matrices.

Each chosen device computes A(m×k)·B(k×n) under ``tf.device``; the result is
compared with a float64 NumPy reference under a tolerance that depends on the
dtype and on k, and the multiply is timed (warm-up, then ``repeats`` timed
runs whose median gives ms and GFLOP/s). A device that computes a wrong
product fails the run and is named, after the per-device table is out.

On a TPU the job also says how much of the 128×128 matrix unit (MXU) the
padding of each dimension wastes (the Cloud TPU performance guide: one dimension is padded to a
multiple of 8, another to a multiple of 128).

A size the machine cannot hold is refused before anything is allocated: the
pre-flight check (``check_runtime``) estimates the bytes the run needs and
compares them with the memory available to this process, so the CLI exits 2
with no run directory. An allocation that still fails during the run (memory
taken by something else meanwhile) becomes a failed run with the same kind of
message, never a dead process. Cancel is honoured between timed multiplies,
so a run stops within one multiply.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any

from jobs.base import JobCancelled, JobSpec, Param, ParamError
from jobs.events import ReplicaValues, Table

DTYPES = ("float32", "bfloat16", "float16")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The memory check, not this bound, is what refuses a size the machine cannot hold.
MAX_DIMENSION = 65536
GIB = 2**30
# cgroup v1 reports "no limit" as a huge page-rounded number.
UNLIMITED_CGROUP_BYTES = 2**60
# Rows of A (and of the product) are padded to a multiple of this on a TPU...
TPU_ROW_TILE = 8
# ...while the contracted dimension k and the output columns n fill the
# 128-wide MXU (the Cloud TPU performance guide).
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


class OutOfMemory(RuntimeError):
    """An allocation failed during the run; the message says which sizes to lower."""


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


def memory_needed(params: dict, devices_share_host_memory: bool) -> tuple[int, int]:
    """Peak bytes the run needs: (on the host, on each accelerator device).

    The host holds the seeded inputs (float32 draws and their cast to
    ``dtype``) for the whole run; first the float64 reference (both inputs
    widened, and the product, which is kept), then, per device, the product
    read back (``dtype``, widened to float64) and |C − C_ref|. Each device
    holds its copies of A and B and two products (the previous one is alive
    while the next is computed). Simulated CPU devices are host memory, and
    they are checked one after the other, so one device's share counts
    towards the host then; an accelerator's share is per device. Measured
    on a CPU session (3000³ and 6000×8·8×6000 float32), the peak grows by
    75-90% of this estimate: it errs on the safe side.
    """
    m, k, n, item = params["m"], params["k"], params["n"], DTYPE_BYTES[params["dtype"]]
    inputs, output = m * k + k * n, m * n
    host_inputs = inputs * (4 + item)
    reference_phase = inputs * 8 + output * 8
    device_share = inputs * item + 2 * output * item
    corrupted_reference = output * 8 if params.get("inject_error") else 0
    check_phase = output * 8 + output * (item + 8 + 8) + corrupted_reference
    if devices_share_host_memory:
        check_phase += device_share
    host = host_inputs + max(reference_phase, check_phase)
    return host, (0 if devices_share_host_memory else device_share)


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as handle:
            text = handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def _inactive_file_bytes(stat_path: str, key: str) -> int:
    """Page cache the kernel can drop, which a cgroup's usage counts."""
    try:
        with open(stat_path, encoding="ascii") as handle:
            for line in handle:
                name, _, value = line.partition(" ")
                if name == key and value.strip().isdigit():
                    return int(value)
    except (OSError, UnicodeDecodeError):
        pass
    return 0


def _cgroup_headroom() -> int | None:
    """Bytes left under this container's memory limit, None without a limit."""
    for limit_path, usage_path, stat_path, inactive_key in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat", "inactive_file"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
         "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file"),
    ):
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is None or usage is None or limit >= UNLIMITED_CGROUP_BYTES:
            continue
        return max(0, limit - max(0, usage - _inactive_file_bytes(stat_path, inactive_key)))
    return None


def available_host_bytes() -> int | None:
    """Memory this process can still take: MemAvailable, capped by a cgroup limit."""
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, OSError, ValueError):
            available = None
    headroom = _cgroup_headroom()
    if headroom is not None:
        available = headroom if available is None else min(available, headroom)
    return available


def available_device_bytes(tf: Any, device_name: str) -> int | None:
    """Free bytes on an accelerator where TensorFlow reports a limit, else None.

    ``tf.config.experimental.get_memory_info`` reports what is in use
    (``current``, ``peak``); only where it also reports a limit can the check
    say what is free. Elsewhere the run relies on catching the allocator's
    ResourceExhaustedError.
    """
    try:
        info = tf.config.experimental.get_memory_info(device_name)
    except Exception:  # noqa: BLE001 - CPUs and some backends do not answer
        return None
    limit = info.get("limit") or info.get("bytes_limit")
    if not limit:
        return None
    return int(limit) - int(info.get("current", 0))


def format_gib(size: float) -> str:
    return f"{size / GIB:.1f} GiB"


def shape_text(params: dict) -> str:
    return f"m={params['m']}, k={params['k']}, n={params['n']} ({params['dtype']})"


def _largest_dimension(params: dict) -> str:
    return max(("m", "k", "n"), key=lambda name: params[name])


def check_memory(params: dict, runtime: Any, available_host: int | None = None) -> None:
    """ParamError naming m, k, n and the sizes when the run cannot fit.

    The field is the largest dimension (the one a form should mark); the
    message names all three.
    """
    on_host = getattr(runtime, "kind", "CPU") == "CPU"
    host_needed, device_needed = memory_needed(params, devices_share_host_memory=on_host)
    available_host = available_host_bytes() if available_host is None else available_host
    if available_host is not None and host_needed > available_host:
        raise ParamError(
            _largest_dimension(params),
            f"{shape_text(params)} needs {format_gib(host_needed)} of host memory, "
            f"{format_gib(available_host)} available; lower m, k or n",
        )
    if on_host or not device_needed or getattr(runtime, "strategy", None) is None:
        # A runtime without a strategy is the dashboard's copy of the
        # description: it never imports TensorFlow; the engine checks at launch.
        return
    import tensorflow as tf

    for device in runtime.logical_devices:
        free = available_device_bytes(tf, device.name)
        if free is not None and device_needed > free:
            raise ParamError(
                _largest_dimension(params),
                f"{shape_text(params)} needs {format_gib(device_needed)} on each device, "
                f"{format_gib(free)} free on {device.name}; lower m, k or n",
            )


def out_of_memory_message(params: dict, error: BaseException) -> str:
    detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"out of memory for {shape_text(params)}: {detail}; lower m, k or n"


def padding_warnings(m: int, k: int, n: int) -> list[str]:
    """What a TPU's MXU wastes on A(m×k)·B(k×n): one line per badly sized dimension.

    The rows m are padded to a multiple of 8; k and n to multiples of 128
    (the Cloud TPU performance guide). The last line gives the share of the padded multiply that is
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
    check_memory(params, runtime)


def _reduced_float32_input_roundoff(tf: Any, kind: str) -> float:
    if kind not in REDUCED_FLOAT32_INPUT_ROUNDOFF:
        return 0.0
    if not tf.config.experimental.tensor_float_32_execution_enabled():
        return 0.0
    return REDUCED_FLOAT32_INPUT_ROUNDOFF[kind]


def _device_suffix(device_name: str) -> str:
    """``/job:localhost/replica:0/task:0/device:CPU:3`` → ``CPU:3``."""
    return device_name.rpartition("device:")[2]


def _median_seconds(multiply, a, b, warmup: int, repeats: int, settle_seconds: float = 0.0,
                    cancelled=lambda: False):
    """Median wall time of ``multiply(a, b)``, each run forced to finish.

    Reading one element of the product back to the host cannot happen
    before the whole multiply is done, on any device, and costs next to
    nothing; the product of the last run is returned for the check. The
    warm-up runs ``warmup`` times and for at least ``settle_seconds``.
    ``cancelled()`` is asked before every multiply (JobCancelled when true),
    so a large check stops within one multiply.
    """
    product = None
    warmed_up = 0
    settle_until = time.perf_counter() + settle_seconds
    while warmed_up < warmup or time.perf_counter() < settle_until:
        if cancelled():
            raise JobCancelled()
        product = multiply(a, b)
        product[:1, :1].numpy()
        warmed_up += 1
    durations = []
    for _ in range(repeats):
        if cancelled():
            raise JobCancelled()
        started = time.perf_counter()
        product = multiply(a, b)
        product[:1, :1].numpy()
        durations.append(time.perf_counter() - started)
    return statistics.median(durations), product


def _check_device(tf: Any, multiply, name: str, inputs: tuple, expected: Any, scale: float,
                  tolerance: float, params: dict, settle_seconds: float = 0.0, cancelled=lambda: False) -> dict:
    """Time the multiply on device ``name`` and compare its product with ``expected``."""
    import numpy as np

    with tf.device(name):
        device_a, device_b = (tf.identity(matrix) for matrix in inputs)
        seconds, product = _median_seconds(
            multiply, device_a, device_b, params["warmup"], params["repeats"], settle_seconds, cancelled
        )
    result = product.numpy().astype(np.float64)
    difference = result - expected
    max_abs_error = float(np.max(np.abs(difference, out=difference)))
    del difference
    relative_error = max_abs_error / scale
    flops = 2.0 * params["m"] * params["k"] * params["n"]
    printed = params["m"] <= PRINTED_SHAPE_LIMIT and params["n"] <= PRINTED_SHAPE_LIMIT
    return {
        "device": name,
        "placed_on": product.device,
        # Only a printable product is kept: eight large ones would not fit.
        "product": result if printed else None,
        # NaN compares False: a device that produces NaN fails.
        "passed": bool(relative_error <= tolerance),
        "max_abs_error": max_abs_error,
        "relative_error": relative_error,
        "median_ms": seconds * 1e3,
        "gflops": flops / seconds / 1e9,
    }


def run(ctx, params: dict) -> dict:
    import tensorflow as tf

    try:
        return _run_check(ctx, params, tf)
    except (MemoryError, tf.errors.ResourceExhaustedError) as error:
        message = out_of_memory_message(params, error)
        ctx.log(message, "error")
        raise OutOfMemory(message) from error


def _run_check(ctx, params: dict, tf: Any) -> dict:
    import numpy as np

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
    multiply = make_multiply(tf)

    ctx.progress(0, len(chosen), "device")
    results: list[dict] = []
    for position, index in enumerate(chosen):
        name = all_devices[index].name
        expected = reference
        if params["inject_error"] and index == params["inject_device"]:
            # Self-test: a wrong reference must make this device fail.
            expected = reference.copy()
            expected[0, 0] += params["inject_error"] * scale
        settle_seconds = BLAS_SETTLE_SECONDS if position == 0 and m * k * n >= BLAS_THREADED_WORK else 0.0
        try:
            if ctx.cancelled():
                raise JobCancelled()
            outcome = _check_device(tf, multiply, name, (host_a, host_b), expected, scale, tolerance, params,
                                    settle_seconds, ctx.cancelled)
        except JobCancelled:
            # The devices finished so far keep their rows; the one cut short has none.
            ctx.log(f"cancelled after {len(results)} of {len(chosen)} devices", "warning")
            _emit_table(ctx, results, params, tolerance)
            raise
        results.append(outcome)
        if outcome["placed_on"] and _device_suffix(outcome["placed_on"]) != _device_suffix(name):
            ctx.log(f"{name}: the product was placed on {outcome['placed_on']}, not on the device asked for", "warning")
        if outcome["product"] is not None:
            ctx.log(f"{name}: {format_matrix(outcome['product'])}")
        verdict = "pass" if outcome["passed"] else "FAIL"
        # A pass is detail: the table at the end shows the same numbers for every device.
        ctx.log(
            f"{name}: {verdict}, relative error {outcome['relative_error']:.3g} "
            f"({'within' if outcome['passed'] else 'exceeds'} the {dtype} tolerance {tolerance:.3g}), "
            f"{outcome['median_ms']:.3f} ms, {outcome['gflops']:.2f} GFLOP/s",
            "debug" if outcome["passed"] else "error",
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


def make_multiply(tf: Any):
    """The timed function: one traced ``tf.matmul`` per run."""
    return tf.function(tf.matmul)


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
