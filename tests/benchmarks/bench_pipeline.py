"""Input pipeline: is training input-bound? (the Cloud TPU performance guide's tf.data rules)

``jobs.datasets.training_pipeline`` on the synthetic MNIST set, as the
train job builds it (on a CPU, one per replica):

1. the examples are made once, in host memory, before any pipeline
   (``jobs.datasets.load_splits``), and each pipeline slices them,
2. ``cache()`` keeps each pipeline's small uint8 shard after the first pass,
3. ``shuffle(10_000)`` comes before ``repeat()`` (shuffle before repeat, so
   epochs do not blur),
4. ``batch(batch, drop_remainder=True)`` (the per-replica batch when each
   replica has its own pipeline),
5. the scaling to float32 is mapped on whole batches with AUTOTUNE (a
   vectorised map),
6. ``prefetch`` last (a fixed depth of 2 batches, see PREFETCH_BATCHES),
   so the next batch is prepared while the step runs.

Two comparisons, alternated A B A B, medians:

- **input alone vs training step**: examples/s of iterating the training
  input exactly as the job feeds ``fit`` on a CPU (one pipeline per
  replica over its shard of the data, per-replica batches,
  ``distribute_datasets_from_function`` with the job's InputOptions), with
  nothing else running, after a warm-up pass that fills the caches,
  against examples/s of the training step fed one constant batch per
  replica (plain Keras ``fit``, the light model, 8 replicas: input costs
  nothing). The input must be faster than the step can consume (ratio
  ≥ 1). One pipeline of global batches, iterated directly, is reported
  beside it.
- **training with the pipeline vs with free input**: the same ``fit`` fed
  by the real pipeline against the constant batch. On two shared cores
  the pipeline's threads compete with the step, so this shows what input
  really costs the training here.
"""

from __future__ import annotations

import gc
import statistics
import time

from tests.benchmarks.bench_overhead import (
    FULL,
    QUICK,
    TrainingSetup,
    cpu_input_options,
    plain_keras_throughputs,
    steady,
)
from tests.benchmarks.harness import Result, alternate

WITH_PIPELINE_TARGET = 0.95


def pipeline_examples_per_second(runtime, setup: TrainingSetup, per_replica: bool, batches: int) -> float:
    """Examples/s of iterating the training input (after a pass that fills the caches).

    ``per_replica``: exactly what the train job feeds ``fit`` on a CPU — one
    ``training_pipeline`` per replica over its shard, per-replica batches,
    through ``distribute_datasets_from_function``. Otherwise one
    ``training_pipeline`` of global batches, iterated directly.
    """
    import tensorflow as tf

    from jobs import datasets as data

    global_batch = setup.batch_per_replica * int(runtime.num_replicas)
    splits = data.load_splits(
        "mnist", "synthetic", limit_train=setup.limit_train, limit_test=setup.limit_test, seed=setup.seed
    )
    if per_replica:

        def replica_dataset(input_context):
            batch = input_context.get_per_replica_batch_size(global_batch)
            return data.training_pipeline(splits.train, batch, setup.seed, input_context=input_context)

        dataset = runtime.strategy.distribute_datasets_from_function(replica_dataset, options=cpu_input_options(tf))
    else:
        dataset = data.training_pipeline(splits.train, global_batch, setup.seed)
    iterator = iter(dataset)
    for _ in range(splits.train_examples // global_batch + 2):
        next(iterator)
    started = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * global_batch / (time.perf_counter() - started)


def run(quick: bool) -> list[Result]:
    from tpudash.accel.runtime import get_runtime
    from tpudash.config import Settings

    setup = (
        QUICK
        if quick
        else TrainingSetup(
            batch_per_replica=FULL.batch_per_replica, limit_train=FULL.limit_train, limit_test=FULL.limit_test, epochs=4
        )
    )
    rounds = 1 if quick else 2
    batches = 10 if quick else 200
    runtime = get_runtime(Settings())

    def measure_training(constant_input: bool):
        def measure() -> float:
            gc.collect()
            return steady(plain_keras_throughputs(runtime, setup, constant_input=constant_input))

        return measure

    with_pipeline, free_input = alternate(measure_training(False), measure_training(True), rounds)
    per_replica, single = alternate(
        lambda: pipeline_examples_per_second(runtime, setup, per_replica=True, batches=batches),
        lambda: pipeline_examples_per_second(runtime, setup, per_replica=False, batches=batches),
        max(rounds, 3),
    )
    gc.collect()
    step = statistics.median(free_input)
    pipeline = statistics.median(per_replica)
    one_pipeline = statistics.median(single)
    trained = statistics.median(with_pipeline)
    global_batch = setup.batch_per_replica * int(runtime.num_replicas)
    choices = (
        "map(AUTOTUNE) → shard → cache → shuffle(10000) → repeat → batch(drop_remainder) → "
        "map(scale, AUTOTUNE) → prefetch(2)"
    )
    return [
        Result(
            benchmark="pipeline",
            figure=f"training input alone ({runtime.num_replicas} per-replica pipelines, global batch {global_batch})",
            value=pipeline,
            unit="ex/s",
            baseline_name="training step, free input",
            baseline=step,
            ratio=pipeline / step,
            target="≥ 1 (not input-bound)",
            met=pipeline >= step,
            samples={"per_replica_pipelines": per_replica, "one_pipeline": single, "training_step": free_input},
            notes=f"each pipeline: {choices}; one pipeline of global batches alone: {one_pipeline:,.0f} ex/s "
            f"({one_pipeline / step:.2f} × the step)",
        ),
        Result(
            benchmark="pipeline",
            figure="fit fed by the pipeline",
            value=trained,
            unit="ex/s",
            baseline_name="fit fed a constant batch",
            baseline=step,
            ratio=trained / step,
            target=f"≥ {WITH_PIPELINE_TARGET}",
            met=trained / step >= WITH_PIPELINE_TARGET,
            samples={"with_pipeline": with_pipeline, "free_input": free_input},
            notes="the same plain Keras fit as the overhead benchmark; both sides share two cores with the pipeline",
        ),
    ]
