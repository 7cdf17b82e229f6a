"""Target: recording a user's own ``fit`` costs it nothing — with ``TpudashCallback`` ≥ 0.98 × without.

On a TPU host the user's script trains and tpudash only watches, through
``tpudash.callbacks.TpudashCallback``. This measures what that callback
costs the user's ``model.fit``, side by side in one process:

- **the model**: the Colab TPU walkthrough's CIFAR-10 CNN
  (``jobs.models.build_model("cifar-cnn")``, 225,034 parameters) built under the 8-replica CPU runtime's
  ``strategy.scope()`` (the project's TPU stand-in: 8 logical CPU devices
  under a MirroredStrategy) and compiled as ``jobs/train.py`` compiles it
  for ``fit`` (Adam, sparse categorical cross-entropy on probabilities,
  accuracy, steps_per_execution 1). Built, compiled and traced once (a
  warm-up ``fit`` of one epoch); both sides then train that same model with
  the same traced step.
- **the data**: a synthetic CIFAR-shaped ``tf.data`` set (32×32×3 float32
  images in [0, 1), labels of 10 classes) at a fixed global batch, cached,
  repeated and prefetched; one data set for both sides, distributed as
  ``jobs/train.py`` distributes its input on a CPU (one pipeline per replica
  over its shard, per-replica batches, ``distribute_datasets_from_function``
  with the job's InputOptions). Handed to ``fit`` undistributed, Keras would
  feed the replicas through a multi-device iterator: here that trained at
  about half the speed, on 0.4–0.6 of the two cores, and each ``fit``
  ended late, waiting for the iterators' tuning threads (see
  ``jobs.trainplan.input_options``).
- **without**: ``model.fit(data, epochs=E, steps_per_epoch=S, verbose=0,
  callbacks=[timer])``.
- **with**: the same with ``callbacks=[TpudashCallback(runs_dir=<temp dir>,
  batch_size=<global batch>), timer]``: its defaults, a batch point at most
  ten times a second; the run written to disk as usual. After each such
  ``fit`` the run's directory must hold a run.json saying ``done`` and
  an examples/s metric for every epoch (the batch points are counted).

The timer is the last callback on both sides and notes the time at every
``on_epoch_end``; an epoch's duration is from the previous epoch's end to
its own, so it includes everything the callback does at an epoch's end and
beginning as well as per batch. The first epoch of each ``fit`` (the
iterator over the distributed data set is made then) is left out; a trial's
figure is examples over the time of the other epochs. Trials alternate
without, with, without, with …; each side's figure is the median over its
trials and the ratio is with ÷ without of those medians (the median of the
paired ratios, each with-trial against the without-trial just before it, is
in the notes). The whole ``fit`` call's time (run creation, the model's
description, the final write) is reported beside it, without a target.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.benchmarks.bench_overhead import cpu_input_options
from tests.benchmarks.harness import Result

TARGET_RATIO = 0.98
MODEL = "cifar-cnn"
IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10


@dataclass(frozen=True)
class CallbackSetup:
    """One side's ``fit``, described once, run identically on both sides."""

    batch_per_replica: int
    distinct_batches: int  # global batches of synthetic data, cached and repeated
    steps_per_epoch: int
    epochs: int  # per fit; the first is left out
    trials: int  # per side
    seed: int = 42
    learning_rate: float = 0.001


# Global batch 128: a step of ~0.1 s on two cores, so the callback's default
# (a batch point at most every 0.1 s) records nearly every batch.
FULL = CallbackSetup(batch_per_replica=16, distinct_batches=8, steps_per_epoch=50, epochs=4, trials=5)
QUICK = CallbackSetup(batch_per_replica=2, distinct_batches=2, steps_per_epoch=4, epochs=2, trials=1)


def synthetic_cifar(tf, strategy, global_batch: int, batches: int, seed: int):
    """CIFAR-shaped examples for ``fit``, distributed as the train job distributes its input on a CPU.

    ``batches`` global batches of random images and labels; every replica
    reads its shard through a pipeline of its own (``distribute_datasets_from_function``
    with the job's InputOptions, checked by ``cpu_input_options``): batched
    to the per-replica batch (global ÷ replicas, ``drop_remainder``), cached,
    repeated, prefetched, without tf.data's tuning thread (see
    ``jobs.datasets.without_tuning_thread``: with it, or with the default
    multi-device iterator, every ``fit`` here would end up to a minute late).
    """
    import numpy as np

    from jobs.datasets import without_tuning_thread

    generator = np.random.default_rng(seed)
    count = global_batch * batches
    images = generator.random((count, *IMAGE_SHAPE), dtype=np.float32)
    labels = generator.integers(0, NUM_CLASSES, size=(count,), dtype=np.int64)

    def replica_dataset(input_context):
        dataset = tf.data.Dataset.from_tensor_slices((images, labels))
        if input_context.num_input_pipelines > 1:
            dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        dataset = (
            dataset.batch(input_context.get_per_replica_batch_size(global_batch), drop_remainder=True)
            .cache()
            .repeat()
            .prefetch(2)
        )
        return without_tuning_thread(dataset)

    return strategy.distribute_datasets_from_function(replica_dataset, options=cpu_input_options(tf))


def compiled_model(strategy, setup: CallbackSetup):
    """The Colab TPU walkthrough's CIFAR-10 CNN under ``strategy.scope()``, compiled as the train job does for ``fit``."""
    import keras

    from jobs.models import MODELS, build_model, parameter_count

    keras.utils.set_random_seed(setup.seed)
    with strategy.scope():
        model = build_model(MODEL, IMAGE_SHAPE, NUM_CLASSES)
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate=setup.learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=MODELS[MODEL].from_logits),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            steps_per_execution=1,
        )
    return model, parameter_count(model)


def epoch_timer():
    """A callback noting the time at every epoch's end (and at ``fit``'s start and end)."""
    import keras

    class EpochTimer(keras.callbacks.Callback):
        # Only epoch hooks: Keras still dispatches batch ends asynchronously,
        # as it does for TpudashCallback (async_safe) and its own History.
        def __init__(self):
            super().__init__()
            self.ends: list[float] = []

        def on_epoch_end(self, epoch, logs=None):
            self.ends.append(time.perf_counter())

    return EpochTimer()


@dataclass
class Trial:
    examples_per_second: float  # over the epochs after the first
    fit_seconds: float  # the whole fit call
    epoch_seconds: list[float]  # every epoch's, the first included


def train(model, data, setup: CallbackSetup, global_batch: int, extra_callbacks: list) -> Trial:
    timer = epoch_timer()
    gc.collect()  # the previous fit's garbage collected here, not inside this one
    started = time.perf_counter()
    model.fit(
        data,
        epochs=setup.epochs,
        steps_per_epoch=setup.steps_per_epoch,
        verbose=0,
        shuffle=False,
        callbacks=[*extra_callbacks, timer],
    )
    fit_seconds = time.perf_counter() - started
    ends = [started, *timer.ends]
    epoch_seconds = [end - begin for begin, end in zip(ends, ends[1:])]
    steady = epoch_seconds[1:] or epoch_seconds
    return Trial(
        examples_per_second=len(steady) * setup.steps_per_epoch * global_batch / sum(steady),
        fit_seconds=fit_seconds,
        epoch_seconds=epoch_seconds,
    )


def check_recorded(callback, setup: CallbackSetup) -> dict:
    """The callback's run on disk: run.json says done; its events hold batch points and per-epoch examples/s."""
    run = callback.run
    if run is None:
        raise RuntimeError("TpudashCallback recorded no run")
    run_dir = Path(run.run_dir)
    meta_path = run_dir / "run.json"
    if not run_dir.is_dir() or not meta_path.is_file():
        raise RuntimeError(f"the callback's run directory {run_dir} or its run.json is missing")
    meta = json.loads(meta_path.read_text())
    if meta.get("status") != "done":
        raise RuntimeError(f"run.json of {run_dir.name} says {meta.get('status')!r}, not 'done' ({meta.get('error')})")
    batch_points = rates = 0
    with open(run_dir / "events.jsonl") as events:
        for line in events:
            event = json.loads(line)
            if event.get("type") != "metric":
                continue
            name = event.get("name")
            if name == "batch_loss":
                batch_points += 1
            elif name == "examples_per_second":
                rates += 1
    if rates != setup.epochs:
        raise RuntimeError(f"{run_dir.name}: {rates} examples_per_second metrics for {setup.epochs} epochs")
    summary_rate = (meta.get("summary") or {}).get("examples_per_second")
    return {
        "run_id": meta.get("run_id", run_dir.name),
        "batch_points": batch_points,
        "recorded_examples_per_second": summary_rate,
    }


def prepare(quick: bool, full: CallbackSetup = FULL):
    """(setup, strategy, global batch, data, compiled model, its parameter count) on the 8-replica CPU runtime."""
    import tensorflow as tf

    from tpudash.accel.runtime import get_runtime
    from tpudash.config import Settings

    setup = QUICK if quick else full
    strategy = get_runtime(Settings()).strategy
    global_batch = setup.batch_per_replica * int(strategy.num_replicas_in_sync)
    data = synthetic_cifar(tf, strategy, global_batch, setup.distinct_batches, setup.seed)
    model, parameters = compiled_model(strategy, setup)
    return setup, strategy, global_batch, data, model, parameters


def run(quick: bool) -> list[Result]:
    from tpudash.callbacks import TpudashCallback

    setup, strategy, global_batch, data, model, parameters = prepare(quick)
    replicas = int(strategy.num_replicas_in_sync)
    runs_dir = Path(tempfile.mkdtemp(prefix="tpudash-bench-callback-"))

    # Warm-up: trace the train step and fill the cache, on neither side's clock.
    model.fit(data, epochs=1, steps_per_epoch=setup.steps_per_epoch, verbose=0, shuffle=False)

    without: list[Trial] = []
    with_callback: list[Trial] = []
    recorded: list[dict] = []
    for trial in range(setup.trials):  # without, with, without, with, …
        without.append(train(model, data, setup, global_batch, []))
        callback = TpudashCallback(runs_dir=runs_dir, batch_size=global_batch)
        with_callback.append(train(model, data, setup, global_batch, [callback]))
        recorded.append(check_recorded(callback, setup))
        print(
            f"[callback] trial {trial + 1}/{setup.trials}: without {without[-1].examples_per_second:,.0f} ex/s, "
            f"with {with_callback[-1].examples_per_second:,.0f} ex/s "
            f"({recorded[-1]['batch_points']} batch points recorded)",
            file=sys.stderr,
            flush=True,
        )
    gc.collect()

    rates_without = [trial.examples_per_second for trial in without]
    rates_with = [trial.examples_per_second for trial in with_callback]
    figure_without = statistics.median(rates_without)
    figure_with = statistics.median(rates_with)
    ratio = figure_with / figure_without
    paired = [side.examples_per_second / base.examples_per_second for side, base in zip(with_callback, without)]
    fit_without = statistics.median(trial.fit_seconds for trial in without)
    fit_with = statistics.median(trial.fit_seconds for trial in with_callback)
    described = (
        f"the Colab TPU walkthrough's CIFAR-10 CNN ({parameters:,} params), synthetic 32×32×3, "
        f"{replicas} replicas, "
        f"global batch {global_batch}, {setup.steps_per_epoch} steps × {setup.epochs - 1} epochs after "
        f"each fit's first, {setup.trials} trials per side alternated; trials without "
        f"{min(rates_without):,.0f}–{max(rates_without):,.0f} ex/s, with {min(rates_with):,.0f}–"
        f"{max(rates_with):,.0f}; median of paired ratios {statistics.median(paired):.3f} "
        f"(range {min(paired):.3f}–{max(paired):.3f}); "
        f"batch points per run {statistics.median(r['batch_points'] for r in recorded):.0f}"
    )
    samples = {
        "without": rates_without,
        "with": rates_with,
        "paired_ratios": paired,
        "epoch_seconds": {
            "without": [t.epoch_seconds for t in without],
            "with": [t.epoch_seconds for t in with_callback],
        },
        "recorded": recorded,
    }
    return [
        Result(
            benchmark="callback",
            figure="fit with TpudashCallback (defaults, batch_size) examples/s",
            value=figure_with,
            unit="ex/s",
            baseline_name="the same fit without it",
            baseline=figure_without,
            ratio=ratio,
            target=f"≥ {TARGET_RATIO} ×",
            met=ratio >= TARGET_RATIO,
            samples=samples,
            notes=described,
        ),
        Result(
            benchmark="callback",
            figure=f"whole fit call ({setup.epochs} epochs) with TpudashCallback",
            value=fit_with,
            unit="s",
            baseline_name="without",
            baseline=fit_without,
            ratio=fit_with / fit_without,
            target="informative",
            samples={"without": [t.fit_seconds for t in without], "with": [t.fit_seconds for t in with_callback]},
            notes="run creation, model description and the final write included; informative, no target",
        ),
    ]
