"""The all-reduce job: each replica contributes replica_id + 1, reduced every way the framework offers, then timed.

SUM and MEAN in replica context and through ``strategy.reduce`` are checked
against the closed form, then a large all-reduce is timed for its bandwidth.
It runs through the session's ``tf.distribute`` strategy here and through
``jax`` collectives in ``jobs.on_jax.replicas``, around one shared check
(``check_all_reduce``): the runner reduces, the check compares, tabulates,
emits the per-replica values and sums up, the same on both frameworks. Its
host-memory check keeps a timed reduction from exhausting a CPU host, whose
logical devices share its memory.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobs.base import JobSpec, Param, ParamError
from jobs.checks import CheckFailed, local_values
from jobs.events import ReplicaValues, Table
from jobs.hostmemory import available_host_bytes, format_gib

BYTES_PER_FLOAT32 = 4
MEGABYTE = 2**20


@dataclass(frozen=True)
class AllReduceChecks:
    """What the framework's reductions of replica_id + 1 gave, and what each is called there."""

    contributions: list[float]
    replica_sum: list[float]
    """The SUM each replica got inside the replicated function (replica context, ``lax.psum``)."""
    replica_mean: list[float]
    overall_sum: float
    """The SUM of the per-replica values from outside (``strategy.reduce``, ``jnp.sum`` of the sharded array)."""
    overall_mean: float
    replica_how: str
    overall_how: str


@dataclass(frozen=True)
class TimedAllReduce:
    """The timed all-reduce SUM: ``reduce_and_wait()`` runs one and waits for every replica's result;
    ``results(reduced)`` reads each replica's result back."""

    reduce_and_wait: Callable[[], Any]
    results: Callable[[Any], list]


def _all_reduce_checks(tf: Any, strategy: Any) -> AllReduceChecks:
    """Contributions, replica-context SUM/MEAN per replica, strategy.reduce SUM/MEAN."""
    SUM, MEAN = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN

    def contribute():
        replica_context = tf.distribute.get_replica_context()
        contribution = tf.cast(replica_context.replica_id_in_sync_group + 1, tf.float32)
        return (
            contribution,
            replica_context.all_reduce(SUM, contribution),
            replica_context.all_reduce(MEAN, contribution),
        )

    contributions, sums, means = tf.function(lambda: strategy.run(contribute))()
    return AllReduceChecks(
        contributions=[float(value) for value in local_values(strategy, contributions)],
        replica_sum=[float(value) for value in local_values(strategy, sums)],
        replica_mean=[float(value) for value in local_values(strategy, means)],
        overall_sum=float(strategy.reduce(SUM, contributions, axis=None).numpy()),
        overall_mean=float(strategy.reduce(MEAN, contributions, axis=None).numpy()),
        replica_how="replica context all_reduce",
        overall_how="strategy.reduce",
    )


def _timed_all_reduce(tf: Any, strategy: Any, elements: int) -> TimedAllReduce:
    # Every replica holds a float32 tensor filled with its replica_id + 1.
    per_replica_tensors = strategy.experimental_distribute_values_from_function(
        lambda context: tf.fill([elements], float(context.replica_id_in_sync_group + 1))
    )

    @tf.function
    def all_reduce_step(values):
        return strategy.run(
            lambda value: tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, value),
            args=(values,),
        )

    def reduce_and_wait():
        reduced = all_reduce_step(per_replica_tensors)
        # Reading one element of every replica's result waits for all of them.
        for value in strategy.experimental_local_results(reduced):
            value[:1].numpy()
        return reduced

    return TimedAllReduce(reduce_and_wait, lambda reduced: local_values(strategy, reduced))


def run_all_reduce(ctx, params: dict) -> dict:
    import tensorflow as tf

    strategy = ctx.runtime.strategy
    return check_all_reduce(
        ctx,
        params,
        strategy.num_replicas_in_sync,
        lambda: _all_reduce_checks(tf, strategy),
        lambda elements: _timed_all_reduce(tf, strategy, elements),
    )


def check_all_reduce(
    ctx,
    params: dict,
    replicas: int,
    reduce_checks: Callable[[], AllReduceChecks],
    timed_all_reduce: Callable[[int], TimedAllReduce],
) -> dict:
    """all-reduce on any framework: ``reduce_checks()`` reduces replica_id + 1 every way the framework has, checked
    against the closed form; ``timed_all_reduce(elements)`` is timed for its bandwidth and its result checked."""
    import numpy as np

    devices = ctx.replica_devices()
    expected_sum = replicas * (replicas + 1) / 2
    expected_mean = (replicas + 1) / 2
    repeats = params["repeats"]

    ctx.progress(0, repeats, "repeat")
    ctx.raise_if_cancelled()
    checks = reduce_checks()
    ctx.emit(ReplicaValues(name="contribution", values=checks.contributions, devices=devices))
    ctx.emit(ReplicaValues(name="all_reduce SUM", values=checks.replica_sum, devices=devices))
    ctx.emit(ReplicaValues(name="all_reduce MEAN", values=checks.replica_mean, devices=devices))

    def close(value: float, expected: float) -> bool:
        return math.isclose(value, expected, rel_tol=1e-6)

    check_rows = []
    for how, op, got, expected in (
        (checks.replica_how, "SUM", checks.replica_sum, expected_sum),
        (checks.replica_how, "MEAN", checks.replica_mean, expected_mean),
        (checks.overall_how, "SUM", [checks.overall_sum], expected_sum),
        (checks.overall_how, "MEAN", [checks.overall_mean], expected_mean),
    ):
        passed = all(close(value, expected) for value in got)
        shown = got[0] if len(set(got)) == 1 else got
        check_rows.append([how, op, shown, expected, "pass" if passed else "FAIL"])
    ctx.emit(
        Table(
            title=f"all-reduce of replica_id + 1 over {replicas} replicas",
            columns=["reduction", "op", "result", "expected", "result ok"],
            rows=check_rows,
        )
    )
    wrong = [f"{row[0]} {row[1]} gave {row[2]}, expected {row[3]}" for row in check_rows if row[4] != "pass"]
    for line in wrong:
        ctx.log(line, "error")

    # The timed part: each element of the SUM must be the same closed form.
    elements = max(1, int(params["size_mb"] * MEGABYTE) // BYTES_PER_FLOAT32)
    size_bytes = elements * BYTES_PER_FLOAT32
    timed = timed_all_reduce(elements)
    for _ in range(params["warmup"]):
        ctx.raise_if_cancelled()
        timed.reduce_and_wait()
    durations = []
    reduced = None
    for repeat in range(repeats):
        ctx.raise_if_cancelled()
        started = time.perf_counter()
        reduced = timed.reduce_and_wait()
        durations.append(time.perf_counter() - started)
        ctx.progress(repeat + 1, repeats, "repeat")
    large_correct = all(np.all(value == expected_sum) for value in timed.results(reduced))
    if not large_correct:
        wrong.append(f"the timed {size_bytes:,}-byte all-reduce SUM is not {expected_sum:g} everywhere")
        ctx.log(wrong[-1], "error")

    median_seconds = statistics.median(durations)
    algorithm_gbps = size_bytes / median_seconds / 1e9
    # The NCCL-tests convention: a ring all-reduce moves 2(N-1)/N of the
    # tensor over each link, which makes figures comparable across N.
    bus_gbps = algorithm_gbps * 2 * (replicas - 1) / replicas
    ctx.emit(
        Table(
            title=f"timed all-reduce SUM, median of {repeats}",
            columns=["bytes", "replicas", "median ms", "algorithm GB/s", "bus GB/s"],
            rows=[[size_bytes, replicas, round(median_seconds * 1e3, 3), round(algorithm_gbps, 3), round(bus_gbps, 3)]],
        )
    )
    ctx.log(
        f"all-reduce of {size_bytes / MEGABYTE:g} MiB over {replicas} replicas: "
        f"{median_seconds * 1e3:.2f} ms, {algorithm_gbps:.2f} GB/s (bus {bus_gbps:.2f} GB/s)"
    )

    summary = {
        "replicas": replicas,
        "sum": checks.overall_sum,
        "mean": checks.overall_mean,
        "replica_sum": checks.replica_sum[0],
        "replica_mean": checks.replica_mean[0],
        "expected_sum": expected_sum,
        "expected_mean": expected_mean,
        "all_correct": not wrong,
        "bytes": size_bytes,
        "median_ms": median_seconds * 1e3,
        "algorithm_gbps": algorithm_gbps,
        "bus_gbps": bus_gbps,
    }
    if wrong:
        ctx.keep_summary(summary)
        raise CheckFailed("all-reduce: " + "; ".join(wrong))
    return summary


# Each replica holds its input, its reduced copy and the collective's buffer.
ALL_REDUCE_COPIES = 3


def check_all_reduce_memory(params: dict, runtime: Any, available_host: int | None = None) -> None:
    """ParamError on ``size_mb`` when the timed all-reduce cannot fit in host memory.

    Logical CPU devices share the host's memory, so every replica's copies
    count against it; on a TPU or GPU each device holds its own and the
    allocator's error is caught like matmul's.
    """
    if getattr(runtime, "kind", "CPU") != "CPU":
        return
    replicas = int(runtime.num_replicas)
    needed = params["size_mb"] * MEGABYTE * replicas * ALL_REDUCE_COPIES
    available = available_host_bytes() if available_host is None else available_host
    if available is not None and needed > available:
        most = available / (MEGABYTE * replicas * ALL_REDUCE_COPIES)
        raise ParamError(
            "size_mb",
            f"{params['size_mb']:g} MiB on each of {replicas} replicas needs {format_gib(needed)} of host memory, "
            f"{format_gib(available)} available; allowed here: at most {most:.0f}",
        )


SPECS = (
    JobSpec(
        name="all-reduce",
        title="All-reduce",
        description=(
            "Each replica contributes replica_id + 1: replica-context all_reduce and strategy.reduce, "
            "SUM and MEAN, checked against the closed form; then a timed all-reduce and its bandwidth."
        ),
        params=(
            Param(
                "size_mb",
                "float",
                4.0,
                "MiB of float32 per replica in the timed all-reduce",
                minimum=0.0,
                minimum_exclusive=True,
                maximum=1024.0,
            ),
            Param("repeats", "int", 10, "timed all-reduces; the median is reported", minimum=1, maximum=1000),
            Param("warmup", "int", 2, "untimed all-reduces first", minimum=0, maximum=100),
        ),
        run=run_all_reduce,
        run_jax="jobs.on_jax.replicas:run_all_reduce",
        check_runtime=check_all_reduce_memory,
    ),
)
