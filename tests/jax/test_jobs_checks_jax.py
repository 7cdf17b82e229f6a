"""The check jobs on JAX: matmul, replica-matmul, replica-dataset, all-reduce and gradient descent.

Each runs as the engine runs it (``tpudash.engine.runner.Runner`` with a run
store) on JAX's runtime, the 8 CPU devices as one batch mesh, and is held to
the figures its TensorFlow runner gives: every device passes the matmul
check, every replica multiplies the "Use TPUs" guide's a and b into
[[22, 28], [49, 64]], range(16) doubled one value per replica, SUM 36 and
MEAN 4.5 over 8 replicas, and the Colab TPU walkthrough's gradient descent line.
"""

from __future__ import annotations

import contextlib
import threading

import pytest

from jobs import get_job
from jobs.events import Progress
from tests.unit.test_gradient_descent import TENSORFLOW_FIGURES, WALKTHROUGH_LINE


@pytest.fixture(scope="module")
def runtime():
    """JAX's runtime over the 8 CPU devices, detected once for this module (the TensorFlow one is never built)."""
    from tpudash.accel.jaxdetect import detect_jax

    return detect_jax(8, use_tpu=False)


def test_every_jax_device_passes_the_matmul_check(run_job, runtime):
    result = run_job("matmul", m=64, k=64, n=64, repeats=2)
    assert result.status == "done"
    [table] = result.tables()
    assert [row[0] for row in table.rows] == [f"CPU:{index}" for index in range(8)]
    assert [row[4] for row in table.rows] == ["pass"] * 8
    assert result.summary["all_passed"] is True
    assert set(result.summary["gflops"]) == set(runtime.device_names)
    [gflops] = result.replica_values("gflops")
    assert len(gflops.values) == 8 and min(gflops.values) > 0


def test_every_replica_multiplies_the_use_tpus_guides_a_and_b(run_job):
    result = run_job("replica-matmul")
    assert result.status == "done"
    [product] = result.replica_values("product")
    assert product.values == [[[22, 28], [49, 64]]] * 8
    assert product.devices == [f"CPU:{index}" for index in range(8)]
    [table] = result.tables()
    assert [row[-1] for row in table.rows] == ["pass"] * 8
    assert result.summary["agree"] is True and result.summary["reference"] == [[22, 28], [49, 64]]
    assert "every replica agrees with the reference: [[22, 28], [49, 64]]" in result.logs()


def test_replica_matmul_with_random_inputs_matches_numpy_on_every_replica(run_job):
    from tests.unit.test_replicas import run_random_replica_matmul

    run_random_replica_matmul(run_job)


def test_range_16_is_doubled_one_value_per_replica(run_job):
    result = run_job("replica-dataset")
    assert result.status == "done"
    assert [event.values for event in result.replica_values("inputs step 0")] == [[[value] for value in range(8)]]
    assert [event.values for event in result.replica_values("outputs step 1")] == [
        [[value] for value in range(16, 32, 2)]
    ]
    assert result.summary["outputs_per_step"] == [[0, 2, 4, 6, 8, 10, 12, 14], [16, 18, 20, 22, 24, 26, 28, 30]]
    assert [event.done for event in result.of_type(Progress)] == [0, 1, 2]


def test_a_short_last_batch_is_split_over_the_replicas_as_tensorflow_splits_it(run_job):
    from tests.unit.test_replicas import run_short_last_batch

    run_short_last_batch(run_job)


def test_all_reduce_gives_the_closed_form_on_every_replica(run_job):
    result = run_job("all-reduce", size_mb=0.25, repeats=2, warmup=1)
    assert result.status == "done"
    assert (result.summary["sum"], result.summary["mean"]) == (36, 4.5)
    assert (result.summary["replica_sum"], result.summary["replica_mean"]) == (36, 4.5)
    assert result.replica_values("contribution")[0].values == [1, 2, 3, 4, 5, 6, 7, 8]
    assert result.replica_values("all_reduce SUM")[0].values == [36] * 8
    assert result.replica_values("all_reduce MEAN")[0].values == [4.5] * 8
    checks, timing = result.tables()
    # JAX's own reductions are named: inside the mapped function, and of the sharded array from outside.
    assert [row[0] for row in checks.rows] == ["lax.psum/pmean in shard_map"] * 2 + [
        "jnp.sum/mean of the sharded array"
    ] * 2
    assert [row[1:] for row in checks.rows] == [
        ["SUM", 36, 36, "pass"],
        ["MEAN", 4.5, 4.5, "pass"],
        ["SUM", 36, 36, "pass"],
        ["MEAN", 4.5, 4.5, "pass"],
    ]
    size_bytes, replicas, median_ms, algorithm_gbps, _ = timing.rows[0]
    assert (size_bytes, replicas) == (2**18, 8) and median_ms > 0 and algorithm_gbps > 0


def test_gradient_descent_prints_the_walkthroughs_line(run_job):
    result = run_job("gradient-descent")
    assert result.status == "done"
    assert result.summary["line"] == WALKTHROUGH_LINE and WALKTHROUGH_LINE in result.logs()
    assert result.summary["device"] == "CPU:0"
    losses, x0, x1 = result.metrics("loss"), result.metrics("x0"), result.metrics("x1")
    assert [metric.step for metric in losses] == list(range(21))
    # The path starts at [1, 4]; SGD on x0² + x1² with lr 0.1 shrinks the point by 0.8 each step.
    assert (x0[0].value, x1[0].value, losses[0].value) == (1.0, 4.0, 17.0)
    assert (x0[1].value, x1[1].value) == pytest.approx((0.8, 3.2))


@pytest.mark.parametrize(("overrides", "loss", "x"), TENSORFLOW_FIGURES)
def test_gradient_descent_ends_where_tensorflow_does(run_job, overrides, loss, x):
    result = run_job("gradient-descent", **overrides)
    assert result.status == "done"
    # float32 rounding over the steps: the last digit or two of a float32 may differ.
    assert result.summary["loss"] == pytest.approx(loss, rel=1e-6)
    assert result.summary["x"] == pytest.approx(x, rel=1e-6)


def test_gradient_descent_runs_on_the_device_asked_for_and_cancel_stops_it(run_job):
    result = run_job("gradient-descent", device=6, on_event=_cancel_after_step(3))
    assert result.status == "cancelled"
    assert [metric.step for metric in result.metrics("loss")] == [0, 1, 2, 3]
    assert "on CPU:6" in result.logs()[0]


def test_gradient_descent_that_diverges_fails_with_advice(run_job):
    result = run_job("gradient-descent", objective="rosenbrock", learning_rate=0.1)
    assert result.status == "failed"
    assert "diverged at step" in result.finished.error and "learning_rate" in result.finished.error


def _cancel_after_step(step: int):
    def cancel(run, event):
        if isinstance(event, Progress) and event.done == step:
            run.cancel_event.set()

    return cancel


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_narrow_dtypes_pass_the_matmul_check_and_a_wrong_device_is_named(run_job, dtype):
    result = run_job(
        "matmul", m=16, k=32, n=16, dtype=dtype, repeats=1, devices="2-4", inject_error=0.5, inject_device=3
    )
    assert result.status == "failed"
    assert result.summary["failed_devices"] == ["CPU:3"]
    [table] = result.tables()
    assert [(row[0], row[4]) for row in table.rows] == [("CPU:2", "pass"), ("CPU:3", "FAIL"), ("CPU:4", "pass")]
    assert "matmul check failed on CPU:3" in result.finished.error


class TpuLookingRuntime:
    """JAX's CPU devices, labelled as a TPU session, to see the TPU-only advice and tolerance."""

    def __init__(self, runtime):
        self.logical_devices = runtime.logical_devices
        self.device_names = runtime.device_names
        self.strategy = runtime.strategy
        self.kind = "TPU"


@pytest.mark.parametrize(("precision", "rounded"), [(None, True), ("highest", False)])
def test_on_a_tpu_the_tolerance_allows_for_jaxs_default_matmul_precision(runtime, tmp_path, precision, rounded):
    import jax

    from jobs.base import JobContext
    from jobs.checks import relative_tolerance

    events = []
    spec = get_job("matmul")
    params = spec.resolve({"m": 100, "k": 64, "n": 128, "devices": "0", "repeats": 1})
    context = JobContext(
        runtime=TpuLookingRuntime(runtime), emit=events.append, run_dir=tmp_path, cancel_event=threading.Event()
    )
    with jax.default_matmul_precision(precision) if precision else contextlib.nullcontext():
        summary = spec.runner_for("jax")(context, params)
    logs = [event.text for event in events if event.type == "log"]
    assert any(line.startswith("k=64 ") and "50.0%" in line for line in logs)  # the MXU padding advice
    assert any("JAX's default matmul precision rounds float32 inputs on this TPU" in line for line in logs) is rounded
    assert summary["tolerance"] == relative_tolerance("float32", 64, 2.0**-8 if rounded else 0.0)
