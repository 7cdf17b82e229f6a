"""Per-replica jobs: the same matmul on every replica, and a distributed dataset.

These run through the session's ``tf.distribute`` strategy, so on a TPU board
they exercise every core the way training does (``strategy.run`` inside a
``tf.function``), and on this CPU every simulated replica.

- ``replica-matmul``: the "Use TPUs" guide's ``strategy.run(matmul_fn, args=(a, b))``;
  every replica must report [[22, 28], [49, 64]].
- ``replica-dataset``: the Colab TPU walkthrough's ``experimental_distribute_dataset`` of
  ``range(N).batch(per_replica × replicas)`` through a per-replica function.

Each job is a TensorFlow runner here and a JAX runner in ``jobs.on_jax.replicas``
(``jax.shard_map`` over the mesh) around one shared check
(``check_replica_matmul``, ``check_replica_dataset``): the runner computes
what every replica holds, the check compares, tabulates, emits the
per-replica values and sums up, the same on both frameworks. The all-reduce
job, a third check of every replica, is ``jobs.all_reduce``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from jobs.base import JobSpec, Param, ParamError
from jobs.checks import PRINTED_SHAPE_LIMIT, CheckFailed, format_matrix, local_values, relative_tolerance
from jobs.events import ReplicaValues, Table

# The inputs of TensorFlow's "Use TPUs" guide: the product is [[22, 28], [49, 64]].
GUIDE_A = ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))
GUIDE_B = ((1.0, 2.0), (3.0, 4.0), (5.0, 6.0))
MATMUL_SOURCES = ("guide", "random")
MAX_REPLICA_MATMUL_DIMENSION = 1024

DATASET_FUNCTIONS = ("double", "square", "identity")
MAX_DATASET_SIZE = 10_000
# Up to this many elements the summary keeps every output (the Colab TPU walkthrough prints them).
SUMMARY_OUTPUT_LIMIT = 1024


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
        ctx, params, lambda a, b: local_values(strategy, replicated_matmul(tf.constant(a), tf.constant(b)))
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
            yield local_values(strategy, batch), local_values(strategy, distributed_step(batch))

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
)
