"""The device check: every logical device multiplies the same seeded matrices.

Each chosen device computes A(m×k)·B(k×n) (under ``tf.device`` on
TensorFlow, on inputs put on the device on JAX: ``jobs.on_jax.matmul``; the
framework's part is a ``MatmulFramework``, the rest is ``run_check``'s); the result is
compared with a float64 NumPy reference under a tolerance that depends on the
dtype and on k, and the multiply is timed (warm-up, then ``repeats`` timed
runs whose median gives ms and GFLOP/s). A device that computes a wrong
product fails the run and is named, after the per-device table is out.

On a TPU the job also says how much of the 128×128 matrix unit (MXU) the
padding of each dimension wastes (the Cloud TPU performance guide: one dimension is padded to a
multiple of 8, another to a multiple of 128).

A size the host cannot hold is refused before anything is allocated: the
pre-flight check (``check_memory``) estimates the host bytes the run needs
and compares them with the memory available to this process, so the CLI
exits 2 with no run directory. An allocation that still fails during the run (memory
taken by something else meanwhile) becomes a failed run with the same kind of
message, never a dead process. Cancel is honoured between timed multiplies,
so a run stops within one multiply.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from jobs.base import JobCancelled, JobSpec, Param, ParamError
from jobs.checks import PRINTED_SHAPE_LIMIT, CheckFailed, format_matrix, relative_tolerance
from jobs.events import ReplicaValues, Table
from jobs.hostmemory import available_host_bytes, format_gib

DTYPES = ("float32", "bfloat16", "float16")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The memory check, not this bound, is what refuses a size the machine cannot hold.
MAX_DIMENSION = 65536
# Rows of A (and of the product) are padded to a multiple of this on a TPU...
TPU_ROW_TILE = 8
# ...while the contracted dimension k and the output columns n fill the
# 128-wide MXU (the Cloud TPU performance guide).
TPU_MXU_TILE = 128

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


class OutOfMemory(RuntimeError):
    """An allocation failed during the run; the message says which sizes to lower."""


def host_memory_needed(params: dict, devices_share_host_memory: bool) -> int:
    """Peak bytes the run needs on the host.

    The host holds the seeded inputs (float32 draws and their cast to
    ``dtype``) for the whole run; first the float64 reference (both inputs
    widened, and the product, which is kept), then, per device, the product
    read back (``dtype``, widened to float64) and |C − C_ref|. Simulated CPU
    devices are host memory, and they are checked one after the other, so
    one device's copies of A and B and its two products (the previous one is
    alive while the next is computed) count towards the host then. Measured
    on a CPU session (3000³ and 6000×8·8×6000 float32), the peak grows by
    75-90% of this estimate: it errs on the safe side.

    An accelerator's own memory is not checked before the run: TensorFlow
    reports what is in use there (``get_memory_info``), never what is free,
    so an allocation that fails becomes a failed run naming the size.
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
    return host_inputs + max(reference_phase, check_phase)


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
    host_needed = host_memory_needed(params, devices_share_host_memory=on_host)
    available_host = available_host_bytes() if available_host is None else available_host
    if available_host is not None and host_needed > available_host:
        raise ParamError(
            _largest_dimension(params),
            f"{shape_text(params)} needs {format_gib(host_needed)} of host memory, "
            f"{format_gib(available_host)} available; lower m, k or n",
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


def _check_runtime(params: dict, runtime: Any) -> None:
    count = len(runtime.logical_devices)
    selection = parse_device_selection(params["devices"])
    chosen = range(count) if selection is None else selection
    for index in chosen:
        if index >= count:
            raise ParamError(
                "devices", f"device {index} is out of range; this session has {count} devices (0-{count - 1})"
            )
    if params["inject_error"] and params["inject_device"] not in chosen:
        raise ParamError(
            "inject_device",
            f"{params['inject_device']} is not among the devices checked ({params['devices']})",
        )
    check_memory(params, runtime)


class MatmulFramework:
    """What the check asks of a framework; ``TensorFlowMatmul`` here, ``jobs.on_jax.matmul.JaxMatmul`` on JAX.

    Everything else (the seeded inputs, the reference, the tolerance, the
    timing, the table, the summary and the verdict) is ``run_check``'s, the
    same for both.
    """

    def reduced_float32_input_roundoff(self, kind: str) -> float:
        """How much a float32 matmul on a ``kind`` device rounds its inputs (0: not at all)."""
        raise NotImplementedError

    def full_float32_advice(self, kind: str) -> str:
        """What the log says when float32 matmuls on a ``kind`` device round their inputs, and how to stop it."""
        raise NotImplementedError

    def cast_inputs(self, host_a: Any, host_b: Any, dtype: str) -> tuple[Any, Any, Any, Any]:
        """A and B cast to ``dtype`` on the host, and the same values as float64 NumPy arrays."""
        raise NotImplementedError

    def time_on_device(self, index: int, inputs: tuple, timing: Any) -> tuple[float, Any, str]:
        """``timing(multiply, a, b, finish)`` with A and B on device ``index``: seconds, product (float64), placed on."""
        raise NotImplementedError

    def is_out_of_memory(self, error: BaseException) -> bool:
        """Whether ``error`` is this framework's failed allocation."""
        raise NotImplementedError


class TensorFlowMatmul(MatmulFramework):
    """The check on TensorFlow: each product computed under ``tf.device`` by one traced ``tf.matmul``."""

    def __init__(self, tf: Any, device_names: list[str]):
        self.tf = tf
        self.device_names = device_names
        self.multiply = make_multiply(tf)

    def reduced_float32_input_roundoff(self, kind: str) -> float:
        if kind not in REDUCED_FLOAT32_INPUT_ROUNDOFF:
            return 0.0
        if not self.tf.config.experimental.tensor_float_32_execution_enabled():
            return 0.0
        return REDUCED_FLOAT32_INPUT_ROUNDOFF[kind]

    def full_float32_advice(self, kind: str) -> str:
        return (
            f"TensorFloat-32 is enabled: float32 matmuls on this {kind} round their inputs, so the tolerance allows "
            "for it (tf.config.experimental.enable_tensor_float_32_execution(False) gives full float32)"
        )

    def cast_inputs(self, host_a: Any, host_b: Any, dtype: str) -> tuple[Any, Any, Any, Any]:
        tf = self.tf
        a, b = (tf.cast(tf.constant(matrix), dtype) for matrix in (host_a, host_b))
        return a, b, tf.cast(a, tf.float64).numpy(), tf.cast(b, tf.float64).numpy()

    def time_on_device(self, index: int, inputs: tuple, timing: Any) -> tuple[float, Any, str]:
        import numpy as np

        tf = self.tf
        with tf.device(self.device_names[index]):
            device_a, device_b = (tf.identity(matrix) for matrix in inputs)
            # Reading one element back cannot happen before the whole multiply is done, on any device.
            seconds, product = timing(self.multiply, device_a, device_b, lambda product: product[:1, :1].numpy())
        return seconds, product.numpy().astype(np.float64), product.device

    def is_out_of_memory(self, error: BaseException) -> bool:
        return isinstance(error, self.tf.errors.ResourceExhaustedError)


def _device_suffix(device_name: str) -> str:
    """``/job:localhost/replica:0/task:0/device:CPU:3`` → ``CPU:3``."""
    return device_name.rpartition("device:")[2]


def _median_seconds(
    multiply, a, b, finish, warmup: int, repeats: int, settle_seconds: float = 0.0, cancelled=lambda: False
):
    """Median wall time of ``multiply(a, b)``, each run forced to finish by ``finish(product)``.

    The product of the last run is returned for the check. The warm-up runs
    ``warmup`` times and for at least ``settle_seconds``. ``cancelled()`` is
    asked before every multiply (JobCancelled when true), so a large check
    stops within one multiply.
    """
    product = None
    warmed_up = 0
    settle_until = time.perf_counter() + settle_seconds
    while warmed_up < warmup or time.perf_counter() < settle_until:
        if cancelled():
            raise JobCancelled()
        product = multiply(a, b)
        finish(product)
        warmed_up += 1
    durations = []
    for _ in range(repeats):
        if cancelled():
            raise JobCancelled()
        started = time.perf_counter()
        product = multiply(a, b)
        finish(product)
        durations.append(time.perf_counter() - started)
    return statistics.median(durations), product


def _check_device(
    framework: MatmulFramework,
    index: int,
    name: str,
    inputs: tuple,
    expected: Any,
    scale: float,
    tolerance: float,
    params: dict,
    settle_seconds: float = 0.0,
    cancelled=lambda: False,
) -> dict:
    """Time the multiply on device ``index`` (called ``name``) and compare its product with ``expected``."""
    import numpy as np

    def timing(multiply, a, b, finish):
        return _median_seconds(multiply, a, b, finish, params["warmup"], params["repeats"], settle_seconds, cancelled)

    seconds, result, placed_on = framework.time_on_device(index, inputs, timing)
    difference = result - expected
    max_abs_error = float(np.max(np.abs(difference, out=difference)))
    del difference
    relative_error = max_abs_error / scale
    flops = 2.0 * params["m"] * params["k"] * params["n"]
    printed = params["m"] <= PRINTED_SHAPE_LIMIT and params["n"] <= PRINTED_SHAPE_LIMIT
    return {
        "device": name,
        "placed_on": placed_on,
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

    device_names = [device.name for device in ctx.runtime.logical_devices]
    return run_check(ctx, params, TensorFlowMatmul(tf, device_names), device_names)


def run_check(ctx, params: dict, framework: MatmulFramework, device_names: list[str]) -> dict:
    """The check on ``framework``, devices called ``device_names``; a failed allocation becomes ``OutOfMemory``."""
    try:
        return _run_check(ctx, params, framework, device_names)
    except Exception as error:
        if not (isinstance(error, MemoryError) or framework.is_out_of_memory(error)):
            raise
        message = out_of_memory_message(params, error)
        ctx.log(message, "error")
        raise OutOfMemory(message) from error


def _run_check(ctx, params: dict, framework: MatmulFramework, device_names: list[str]) -> dict:
    import numpy as np

    runtime = ctx.runtime
    m, k, n, dtype = params["m"], params["k"], params["n"], params["dtype"]
    selection = parse_device_selection(params["devices"])
    chosen = list(range(len(device_names))) if selection is None else list(selection)

    if runtime.kind == "TPU":
        for line in padding_warnings(m, k, n):
            ctx.log(line, "warning")
    reduced_roundoff = framework.reduced_float32_input_roundoff(runtime.kind)
    if dtype == "float32" and reduced_roundoff:
        ctx.log(framework.full_float32_advice(runtime.kind))
    tolerance = relative_tolerance(dtype, k, reduced_roundoff)

    generator = np.random.default_rng(params["seed"])
    host_a = generator.standard_normal((m, k), dtype=np.float32)
    host_b = generator.standard_normal((k, n), dtype=np.float32)
    # The reference multiplies exactly the values the devices get.
    *inputs, wide_a, wide_b = framework.cast_inputs(host_a, host_b, dtype)
    del host_a, host_b
    reference = wide_a @ wide_b
    del wide_a, wide_b
    scale = max(float(np.max(np.abs(reference))), np.finfo(np.float64).tiny)

    ctx.progress(0, len(chosen), "device")
    results: list[dict] = []
    for position, index in enumerate(chosen):
        name = device_names[index]
        expected = reference
        if params["inject_error"] and index == params["inject_device"]:
            # Self-test: a wrong reference must make this device fail.
            expected = reference.copy()
            expected[0, 0] += params["inject_error"] * scale
        settle_seconds = BLAS_SETTLE_SECONDS if position == 0 and m * k * n >= BLAS_THREADED_WORK else 0.0
        try:
            if ctx.cancelled():
                raise JobCancelled()
            outcome = _check_device(
                framework,
                index,
                name,
                tuple(inputs),
                expected,
                scale,
                tolerance,
                params,
                settle_seconds,
                ctx.cancelled,
            )
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
    ctx.emit(
        ReplicaValues(
            name="gflops", values=[row["gflops"] for row in results], devices=[row["device"] for row in results]
        )
    )
    if summary["failed_devices"]:
        failed = ", ".join(summary["failed_devices"])
        ctx.log(f"matmul check failed on {failed}", "error")
        ctx.keep_summary(summary)
        raise CheckFailed(f"matmul check failed on {failed}")
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
        [
            row["device"],
            float(f"{row['max_abs_error']:.3g}"),
            float(f"{row['relative_error']:.3g}"),
            float(f"{tolerance:.3g}"),
            "pass" if row["passed"] else "FAIL",
            round(row["median_ms"], 3),
            round(row["gflops"], 2),
        ]
        for row in results
    ]
    ctx.emit(
        Table(
            title=f"matmul check: {m}×{k}·{k}×{n} {params['dtype']}, median of {params['repeats']}",
            columns=["device", "max abs error", "relative error", "tolerance", "result", "median ms", "GFLOP/s"],
            rows=rows,
        )
    )


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
            Param(
                "warmup",
                "int",
                1,
                "untimed multiplies per device first (tracing, caches); the first device "
                "also warms up for 0.25 s after a large NumPy reference",
                minimum=0,
                maximum=100,
            ),
            Param("seed", "int", 0, "seed of the random matrices", minimum=0, maximum=2**31 - 1),
            Param(
                "devices",
                "str",
                "all",
                "which devices: all, or indices and ranges such as 0,2,4-7",
                check=_check_device_selection,
            ),
            Param(
                "inject_error",
                "float",
                0.0,
                "self-test: corrupt one reference element by this fraction of the product's largest "
                "magnitude; anything above the tolerance must make inject_device fail",
                minimum=0.0,
            ),
            Param("inject_device", "int", 0, "the device whose reference inject_error corrupts", minimum=0),
        ),
        run=run,
        run_jax="jobs.on_jax.matmul:run",
        key="m",
        check_runtime=_check_runtime,
    ),
)
