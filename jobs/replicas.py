"""Per-replica jobs: the same matmul on every replica, a distributed dataset, all-reduce.

These run through the session's ``tf.distribute`` strategy, so on a TPU board
they exercise every core the way training does (``strategy.run`` inside a
``tf.function``), and on this CPU every simulated replica.

- ``replica-matmul``: the "Use TPUs" guide's ``strategy.run(matmul_fn, args=(a, b))``;
  every replica must report [[22, 28], [49, 64]].
- ``replica-dataset``: the Colab TPU walkthrough's ``experimental_distribute_dataset`` of
  ``range(N).batch(per_replica × replicas)`` through a per-replica function.
- ``all-reduce``: each replica contributes replica_id + 1; SUM and MEAN in
  replica context and through ``strategy.reduce`` are checked against the
  closed form, then a large all-reduce is timed for its bandwidth.

Each job is a TensorFlow runner here and a JAX runner in ``jobs.on_jax.replicas``
(``jax.shard_map`` over the mesh) around one shared check
(``check_replica_matmul``, ``check_replica_dataset``, ``check_all_reduce``): the
runner computes what every replica holds, the check compares, tabulates, emits
the per-replica values and sums up, the same on both frameworks.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from jobs.base import JobSpec, Param, ParamError
from jobs.checks import PRINTED_SHAPE_LIMIT, CheckFailed, format_matrix, relative_tolerance
from jobs.events import ReplicaValues, Table
from jobs.hostmemory import available_host_bytes, format_gib

# The inputs of TensorFlow's "Use TPUs" guide: the product is [[22, 28], [49, 64]].
GUIDE_A = ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))
GUIDE_B = ((1.0, 2.0), (3.0, 4.0), (5.0, 6.0))
MATMUL_SOURCES = ("guide", "random")
MAX_REPLICA_MATMUL_DIMENSION = 1024

DATASET_FUNCTIONS = ("double", "square", "identity")
MAX_DATASET_SIZE = 10_000
# Up to this many elements the summary keeps every output (the Colab TPU walkthrough prints them).
SUMMARY_OUTPUT_LIMIT = 1024

BYTES_PER_FLOAT32 = 4
MEGABYTE = 2**20


def _local_values(strategy: Any, distributed: Any) -> list:
    return [value.numpy() for value in strategy.experimental_local_results(distributed)]


# -- replica-matmul -------------------------------------------------------------


def _check_replica_matmul_params(params: dict) -> None:
    if params["source"] == "guide" and (params["m"], params["k"], params["n"]) != (2, 3, 2):
        raise ParamError(
            "source",
            "m, k and n apply only to source=random; the guide's a and b are 2×3 and 3×2",
        )


def replica_matmul_inputs(params: dict) -> tuple[Any, Any]:
    """The float32 a and b every replica multiplies: the guide's, or seeded m×k and k×n."""
    import numpy as np

    if params["source"] == "guide":
        return np.array(GUIDE_A, dtype=np.float32), np.array(GUIDE_B, dtype=np.float32)
    generator = np.random.default_rng(params["seed"])
    host_a = generator.standard_normal((params["m"], params["k"]), dtype=np.float32)
    host_b = generator.standard_normal((params["k"], params["n"]), dtype=np.float32)
    return host_a, host_b


def run_replica_matmul(ctx, params: dict) -> dict:
    import tensorflow as tf

    strategy = ctx.runtime.strategy

    @tf.function
    def matmul_fn(x, y):
        return tf.matmul(x, y)

    @tf.function
    def replicated_matmul(x, y):
        return strategy.run(matmul_fn, args=(x, y))

    return check_replica_matmul(
        ctx, params, lambda a, b: _local_values(strategy, replicated_matmul(tf.constant(a), tf.constant(b)))
    )


def check_replica_matmul(ctx, params: dict, multiply_on_every_replica: Callable[[Any, Any], list]) -> dict:
    """replica-matmul on any framework: ``multiply_on_every_replica(a, b)`` gives each replica's product, in order;
    this checks them against the float64 reference and reports them."""
    import numpy as np

    devices = ctx.replica_devices()
    host_a, host_b = replica_matmul_inputs(params)
    reference = host_a.astype(np.float64) @ host_b.astype(np.float64)
    reference_scale = max(float(np.max(np.abs(reference))), np.finfo(np.float64).tiny)
    tolerance = relative_tolerance("float32", host_a.shape[1])

    ctx.progress(0, 1, "run")
    ctx.raise_if_cancelled()
    products = multiply_on_every_replica(host_a, host_b)
    ctx.progress(1, 1, "run")

    small = reference.shape[0] <= PRINTED_SHAPE_LIMIT and reference.shape[1] <= PRINTED_SHAPE_LIMIT
    errors = [float(np.max(np.abs(product.astype(np.float64) - reference))) for product in products]
    matches = [error / reference_scale <= tolerance for error in errors]
    agree = all(np.array_equal(product, products[0]) for product in products)
    rows = []
    for replica, (device, product, error, match) in enumerate(zip(devices, products, errors, matches)):
        rows.append([replica, device, float(f"{error:.3g}"), "pass" if match else "FAIL"])
        if small:
            # The per-replica product table says it too: a detail for the log pane, not the headless output.
            ctx.log(f"replica {replica} ({device}): {format_matrix(product)}", "debug")
    if small:
        ctx.emit(ReplicaValues(name="product", values=[product.tolist() for product in products], devices=devices))
    # The table first: the headless output then leaves out the per-replica errors it already shows.
    ctx.emit(
        Table(
            title=f"replica-matmul: {reference.shape[0]}×{host_a.shape[1]}·{host_b.shape[0]}×{reference.shape[1]} "
            f"on {len(products)} replicas",
            columns=["replica", "device", "max abs error", "result"],
            rows=rows,
        )
    )
    ctx.emit(ReplicaValues(name="max abs error", values=errors, devices=devices))

    failed = [device for device, match in zip(devices, matches) if not match]
    summary = {
        "replicas": len(products),
        "agree": bool(agree),
        "matches_reference": not failed,
        "failed_devices": failed,
        "max_abs_error": max(errors),
        "tolerance": tolerance,
    }
    if small:
        summary["reference"] = reference.tolist()
    if failed:
        ctx.log(f"replica-matmul: wrong product on {', '.join(failed)}", "error")
        ctx.keep_summary(summary)
        raise CheckFailed(f"replica-matmul: wrong product on {', '.join(failed)}")
    if small:
        ctx.log(f"every replica agrees with the reference: {format_matrix(reference)}")
    else:
        ctx.log(f"every replica agrees with the reference (max abs error {max(errors):.3g})")
    return summary


# -- replica-dataset ------------------------------------------------------------


def replica_function(name: str):
    """What each replica computes, as one formula for the device (a tensor, a JAX array) and the host's check."""
    return {"double": lambda x: x * 2, "square": lambda x: x * x, "identity": lambda x: x}[name]


def replica_dataset_plan(n: int, per_replica: int, replicas: int) -> list[list[list[int]]]:
    """Each step's inputs per replica: ``range(n).batch(per_replica × replicas)`` split as TensorFlow splits it.

    ``experimental_distribute_dataset`` gives every replica ceil(batch / replicas)
    consecutive elements of a batch, so a short last batch fills the first
    replicas and leaves the last ones empty (range(20) in batches of 16 over 8:
    the second step is [16], [17], [18], [19], [], [], [], []).
    """
    global_batch = per_replica * replicas
    plan = []
    for first in range(0, n, global_batch):
        batch = list(range(first, min(first + global_batch, n)))
        share = math.ceil(len(batch) / replicas)
        plan.append([batch[replica * share : (replica + 1) * share] for replica in range(replicas)])
    return plan


def run_replica_dataset(ctx, params: dict) -> dict:
    import tensorflow as tf

    strategy = ctx.runtime.strategy
    replicas = strategy.num_replicas_in_sync
    dataset = tf.data.Dataset.range(params["n"]).batch(params["per_replica"] * replicas)
    distributed_dataset = strategy.experimental_distribute_dataset(dataset)
    # One tf.function, like the walkthrough's double_fn.
    per_replica_fn = tf.function(replica_function(params["fn"]))

    @tf.function
    def distributed_step(batch):
        return strategy.run(per_replica_fn, args=(batch,))

    def steps():
        for batch in distributed_dataset:
            yield _local_values(strategy, batch), _local_values(strategy, distributed_step(batch))

    return check_replica_dataset(ctx, params, replicas, steps())


def check_replica_dataset(ctx, params: dict, replicas: int, steps: Iterator[tuple[list, list]]) -> dict:
    """replica-dataset on any framework: ``steps`` yields each step's (inputs, outputs) per replica, computed when
    asked (a cancel is honoured before each); this checks, reports and sums them up."""
    import numpy as np

    devices = ctx.replica_devices()
    global_batch = params["per_replica"] * replicas
    total_steps = math.ceil(params["n"] / global_batch)
    expected_fn = replica_function(params["fn"])
    ctx.log(
        f"range({params['n']}).batch({params['per_replica']} × {replicas} = {global_batch}) "
        f"through {params['fn']} on {replicas} replicas: {total_steps} steps"
    )
    ctx.progress(0, total_steps, "step")
    outputs_per_step = []
    wrong_steps = []
    for step in range(total_steps):
        ctx.raise_if_cancelled()
        inputs, outputs = next(steps)
        ctx.emit(ReplicaValues(name=f"inputs step {step}", values=[item.tolist() for item in inputs], devices=devices))
        ctx.emit(
            ReplicaValues(name=f"outputs step {step}", values=[item.tolist() for item in outputs], devices=devices)
        )
        if not all(np.array_equal(output, expected_fn(item)) for item, output in zip(inputs, outputs)):
            wrong_steps.append(step)
            ctx.log(f"step {step}: a replica's output is not {params['fn']} of its input", "error")
        outputs_per_step.append([value for item in outputs for value in item.tolist()])
        ctx.progress(step + 1, total_steps, "step")

    summary = {
        "replicas": replicas,
        "global_batch": global_batch,
        "steps": len(outputs_per_step),
        "fn": params["fn"],
        "correct": not wrong_steps,
    }
    if params["n"] <= SUMMARY_OUTPUT_LIMIT:
        summary["outputs_per_step"] = outputs_per_step
    if wrong_steps:
        ctx.keep_summary(summary)
        raise CheckFailed(f"replica-dataset: wrong outputs at steps {wrong_steps}")
    return summary


# -- all-reduce -------------------------------------------------------------------


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
        contributions=[float(value) for value in _local_values(strategy, contributions)],
        replica_sum=[float(value) for value in _local_values(strategy, sums)],
        replica_mean=[float(value) for value in _local_values(strategy, means)],
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

    return TimedAllReduce(reduce_and_wait, lambda reduced: _local_values(strategy, reduced))


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


# m, k, n and seed make the random inputs; the guide's a and b are fixed.
RANDOM_SOURCE_ONLY = ("source", ("random",))

SPECS = (
    JobSpec(
        name="replica-matmul",
        title="Replica matmul",
        description=(
            'strategy.run(matmul_fn, args=(a, b)) with the same inputs on every replica (TensorFlow\'s "Use TPUs" '
            "guide); "
            "every replica must match the reference, [[22, 28], [49, 64]] by default."
        ),
        params=(
            Param(
                "source",
                "str",
                "guide",
                'guide: the a and b of TensorFlow\'s "Use TPUs" guide; random: seeded m×k and k×n',
                choices=MATMUL_SOURCES,
            ),
            Param(
                "m",
                "int",
                2,
                "rows of a (source=random)",
                minimum=1,
                maximum=MAX_REPLICA_MATMUL_DIMENSION,
                applies_when=RANDOM_SOURCE_ONLY,
            ),
            Param(
                "k",
                "int",
                3,
                "columns of a, rows of b (source=random)",
                minimum=1,
                maximum=MAX_REPLICA_MATMUL_DIMENSION,
                applies_when=RANDOM_SOURCE_ONLY,
            ),
            Param(
                "n",
                "int",
                2,
                "columns of b (source=random)",
                minimum=1,
                maximum=MAX_REPLICA_MATMUL_DIMENSION,
                applies_when=RANDOM_SOURCE_ONLY,
            ),
            Param(
                "seed",
                "int",
                0,
                "seed of the random inputs (source=random)",
                minimum=0,
                maximum=2**31 - 1,
                applies_when=RANDOM_SOURCE_ONLY,
            ),
        ),
        run=run_replica_matmul,
        run_jax="jobs.on_jax.replicas:run_replica_matmul",
        key="r",
        check_params=_check_replica_matmul_params,
    ),
    JobSpec(
        name="replica-dataset",
        title="Replica dataset",
        description=(
            "experimental_distribute_dataset(range(n).batch(per_replica × replicas)) through a per-replica "
            "function (the Colab TPU walkthrough's double_fn): each step's inputs and outputs per replica."
        ),
        params=(
            Param("n", "int", 16, "elements of tf.data.Dataset.range(n)", minimum=1, maximum=MAX_DATASET_SIZE),
            Param("per_replica", "int", 1, "elements per replica per step", minimum=1, maximum=1024),
            Param("fn", "str", "double", "what each replica computes", choices=DATASET_FUNCTIONS),
        ),
        run=run_replica_dataset,
        run_jax="jobs.on_jax.replicas:run_replica_dataset",
    ),
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
