"""Target 1: watching costs nothing — training under tpudash ≥ 0.98 × a plain Keras ``fit``.

The same training three ways on an 8-replica CPU runtime — plain and
headless in this process, the TUI's in the engine process it starts —
alternated plain → headless → TUI, round after round:

- **plain**: what a user would write without tpudash: ``jobs.models.build_model``
  under ``strategy.scope()``, the same compile (Adam, sparse categorical
  cross-entropy from logits, accuracy, steps_per_execution 1), the same
  ``jobs.datasets`` synthetic data and ``training_pipeline``, distributed as
  ``jobs/train.py``'s ``_train_with_fit`` does on a CPU (one host pipeline
  per replica through ``distribute_datasets_from_function``, the same
  ``InputOptions``: checked against ``jobs.trainplan.input_options``),
  ``model.fit(verbose=0)`` with the same ``steps_per_epoch``, and the same
  validation after every epoch (one pass over the distributed test split
  with a ``strategy.run`` step, like the job's Evaluator).
- **headless**: ``tpudash run train --set …`` through ``tpudash.cli.main.main``,
  its rich live display writing to a null stream that says it is a
  terminal (so the progress display refreshes as it would on screen), the
  run recorded to disk as usual.
- **TUI**: ``TpudashApp`` under Pilot (``run_test``, 120×40, headless
  driver: every frame is composed, none is written to a terminal) as users
  get it: no ``engine_factory``, so the job runs in the engine process the
  app starts (``python -m tpudash.engine``, nice 10, its own TensorFlow and
  8-device CPU runtime); the app follows the run by tailing its
  events.jsonl and draws the run view live. The engine is started (and its
  runtime detected) before the launch, as the Devices screen does at start.

Throughput is measured the same way on every side: examples in an epoch's
training part (``on_epoch_begin`` to the start of ``on_epoch_end``, before
validation) over its duration — for tpudash, the ``examples_per_second``
metric the job reports, which is defined exactly so. The first epoch
(tracing, cache fill) is excluded; a run's figure is the median of the
rest, and a side's figure the median over rounds. The ratio pairs each
round's run with the plain run of the same round (median of those
ratios), since load from other processes drifts over minutes. The
dashboard's CPU time is reported too (its UI thread, and the whole
process: the engine's pipe reader included), and the engine's: with
training on both cores, every CPU-second the dashboard spends drawing is
one training could have had.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.benchmarks.harness import Result

TARGET_RATIO = 0.98


@dataclass(frozen=True)
class TrainingSetup:
    """One training, described once, run identically on every side."""

    batch_per_replica: int
    limit_train: int
    limit_test: int
    epochs: int
    seed: int = 42
    learning_rate: float = 0.001

    def overrides(self) -> dict[str, str]:
        """The job's params as ``--set`` text (everything else at its default: fit loop, float32, adam)."""
        return {
            "dataset": "mnist",
            "source": "synthetic",
            "model": "light",
            "loop": "fit",
            "steps_per_execution": "1",
            "optimizer": "adam",
            "precision": "float32",
            "learning_rate": str(self.learning_rate),
            "epochs": str(self.epochs),
            "batch_per_replica": str(self.batch_per_replica),
            "limit_train": str(self.limit_train),
            "limit_test": str(self.limit_test),
            "seed": str(self.seed),
        }


FULL = TrainingSetup(batch_per_replica=64, limit_train=20_480, limit_test=512, epochs=4)
QUICK = TrainingSetup(batch_per_replica=8, limit_train=640, limit_test=64, epochs=2)


def steady(throughputs: list[float]) -> float:
    """A run's figure: the median over epochs after the first."""
    rest = throughputs[1:] or throughputs
    return statistics.median(rest)


# -- plain Keras -------------------------------------------------------------------


def cpu_input_options(tf):
    """How the train job distributes its input on CPU replicas, spelled out as a user would.

    One host pipeline per replica (``PER_REPLICA``, per-replica batches over
    a shard of the data, no copy to a device), built by
    ``distribute_datasets_from_function``: what ``jobs/train.py``'s
    ``_train_with_fit`` does on a CPU. If the job changes its choice, this
    benchmark stops rather than compare two different things.
    """
    from jobs.trainplan import input_options

    options = tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
        experimental_fetch_to_device=False,
    )
    job_options = input_options(tf, "CPU")
    compared = (
        "experimental_replication_mode",
        "experimental_fetch_to_device",
        "experimental_place_dataset_on_device",
        "experimental_per_replica_buffer_size",
    )
    differing = [name for name in compared if getattr(options, name) != getattr(job_options, name, None)]
    if differing:
        raise RuntimeError(
            f"jobs.trainplan.input_options now differs from the plain script's in {', '.join(differing)}: "
            f"update plain_keras_throughputs to feed the data as the job does"
        )
    return options


def plain_keras_throughputs(runtime, setup: TrainingSetup, constant_input: bool = False) -> list[float]:
    """Examples/s of each epoch's training part, with nothing but Keras watching.

    ``constant_input`` feeds every replica one batch from its pipeline over
    and over (``take(1).cache().repeat()``): training with free input, the
    ceiling the input pipeline is compared with.
    """
    import keras
    import tensorflow as tf

    from jobs import datasets as data
    from jobs.models import MODELS, build_model

    strategy = runtime.strategy
    global_batch = setup.batch_per_replica * int(strategy.num_replicas_in_sync)
    keras.utils.set_random_seed(setup.seed)
    splits = data.load_splits(
        "mnist", "synthetic", limit_train=setup.limit_train, limit_test=setup.limit_test, seed=setup.seed
    )
    steps_per_epoch = splits.train_examples // global_batch
    from_logits = MODELS["light"].from_logits
    options = cpu_input_options(tf)
    with strategy.scope():
        model = build_model("light", splits.shape.image_shape, splits.shape.num_classes)
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate=setup.learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            steps_per_execution=1,
        )
        val_loss = keras.metrics.Mean(name="val_loss")
        val_accuracy = keras.metrics.SparseCategoricalAccuracy(name="val_accuracy")

    def train_dataset(input_context):
        batch = input_context.get_per_replica_batch_size(global_batch)
        pipeline = data.training_pipeline(splits.train, batch, setup.seed, input_context=input_context)
        if constant_input:
            # The first batch, kept and served again: no Python iterator to
            # create and delete (deleting one waits for tf.data's tuning threads).
            pipeline = pipeline.take(1).cache().repeat()
        return pipeline

    def test_dataset(input_context):
        batch = input_context.get_per_replica_batch_size(global_batch)
        return data.evaluation_pipeline(splits.test, batch, input_context=input_context)

    train = strategy.distribute_datasets_from_function(train_dataset, options=options)
    test = strategy.distribute_datasets_from_function(test_dataset, options=options)
    per_example_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits, reduction="none")

    def replica_validation_step(inputs):
        images, labels = inputs
        outputs = model(images, training=False)
        val_loss.update_state(per_example_loss(labels, outputs))
        val_accuracy.update_state(labels, outputs)

    @tf.function(reduce_retracing=True)
    def validation_step(inputs):
        strategy.run(replica_validation_step, args=(inputs,))

    class EpochTimer(keras.callbacks.Callback):
        """Times each epoch's training part, then validates (outside the timed part)."""

        def __init__(self):
            super().__init__()
            self.throughputs: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.started = _now()

        def on_epoch_end(self, epoch, logs=None):
            seconds = _now() - self.started
            self.throughputs.append(steps_per_epoch * global_batch / seconds)
            val_loss.reset_state()
            val_accuracy.reset_state()
            for inputs in test:
                validation_step(inputs)
            self.last_validation = {"loss": float(val_loss.result()), "accuracy": float(val_accuracy.result())}

    timer = EpochTimer()
    model.fit(train, epochs=setup.epochs, steps_per_epoch=steps_per_epoch, callbacks=[timer], verbose=0, shuffle=False)
    return timer.throughputs


def _now() -> float:
    return time.perf_counter()


# -- tpudash headless ----------------------------------------------------------------


class NullTerminal(io.TextIOBase):
    """Swallows output but says it is a terminal, so rich draws its live display as on screen."""

    def isatty(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return len(text)


def recorded_throughputs(runs_dir: Path) -> list[float]:
    """The per-epoch ``examples_per_second`` of the only run recorded in ``runs_dir``."""
    from jobs.events import Metric
    from tpudash.runs.store import RunStore

    store = RunStore(runs_dir)
    runs = store.list_runs()
    if len(runs) != 1:
        raise RuntimeError(f"expected one run in {runs_dir}, found {len(runs)}")
    if runs[0].status != "done":
        raise RuntimeError(f"the train run ended {runs[0].status}: {runs[0].error}")
    data = store.load(runs[0].run_id)
    return [
        event.value
        for _, event in data.events
        if isinstance(event, Metric) and event.name == "examples_per_second" and event.split == "train"
    ]


def headless_throughputs(setup: TrainingSetup) -> list[float]:
    """``tpudash run train --set …`` in this process, its display to a null terminal."""
    from tpudash.cli import main as cli

    runs_dir = Path(tempfile.mkdtemp(prefix="tpudash-bench-headless-"))
    argv = ["run", "train", "--runs-dir", str(runs_dir)]
    for name, value in setup.overrides().items():
        argv += ["--set", f"{name}={value}"]
    with contextlib.redirect_stdout(NullTerminal()):
        code = cli.main(argv)
    if code != 0:
        raise RuntimeError(f"tpudash run train exited {code}")
    return recorded_throughputs(runs_dir)


# -- tpudash TUI ---------------------------------------------------------------------


TUI_SIZE = (120, 40)
RUN_TIMEOUT = 900.0


async def _tui_run(setup: TrainingSetup, runs_dir: Path) -> dict:
    """Launch train in the TUI (engine process), wait for its end; the CPU each side used meanwhile (cores)."""
    import os

    from tests.benchmarks.harness import process_cpu_seconds, wait_for_engine_exit
    from tpudash.config import Settings
    from tpudash.tui.app import TpudashApp

    app = TpudashApp(Settings(runs_dir=runs_dir))
    async with app.run_test(size=TUI_SIZE) as pilot:
        await asyncio.wait_for(app.runtime_settled.wait(), RUN_TIMEOUT)
        if app.runtime is None:
            raise RuntimeError(f"the engine has no runtime: {app.runtime_error}")
        engine = app.session.lane.engine
        engine_started = process_cpu_seconds(engine.pid)
        thread_started, wall_started = time.thread_time(), time.perf_counter()
        times = os.times()
        process_started = times.user + times.system
        live = app.session.launch_by_name("train", setup.overrides())
        if live is None:
            raise RuntimeError(f"the TUI refused the launch: {app.notices[-1:]}")
        await asyncio.wait_for(live.settled.wait(), RUN_TIMEOUT)
        wall = time.perf_counter() - wall_started
        engine_ended = process_cpu_seconds(engine.pid)
        times = os.times()
        loads = {
            "ui_thread": (time.thread_time() - thread_started) / wall,
            "dashboard_process": (times.user + times.system - process_started) / wall,
            "engine_process": (engine_ended - engine_started) / wall
            if None not in (engine_started, engine_ended)
            else float("nan"),
        }
        await pilot.pause()
    wait_for_engine_exit(engine)
    return loads


def tui_throughputs(setup: TrainingSetup, loads: list[dict] | None = None) -> list[float]:
    """The TUI driven by Pilot launches train in its engine process and shows it live until it ends.

    The app's event loop runs in this (the main) thread; what the UI thread,
    the dashboard process and the engine used over the run is appended to
    ``loads`` (in cores).
    """
    runs_dir = Path(tempfile.mkdtemp(prefix="tpudash-bench-tui-"))
    measured = asyncio.run(_tui_run(setup, runs_dir))
    if loads is not None:
        loads.append(measured)
    return recorded_throughputs(runs_dir)


# -- the benchmark -------------------------------------------------------------------


def run(quick: bool) -> list[Result]:
    from tpudash.accel.runtime import get_runtime
    from tpudash.config import Settings

    setup = QUICK if quick else FULL
    rounds = 1 if quick else 5
    runtime = get_runtime(Settings())
    loads: list[dict] = []
    sides = {
        "plain": lambda: plain_keras_throughputs(runtime, setup),
        "headless": lambda: headless_throughputs(setup),
        "tui": lambda: tui_throughputs(setup, loads),
    }
    epochs: dict[str, list[list[float]]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, measure in sides.items():  # plain, headless, TUI, plain, headless, TUI, …
            # The previous run's distributed iterators wait in reference
            # cycles; free them here, not in the middle of the next run.
            gc.collect()
            epochs[name].append(measure())
    gc.collect()
    per_run = {name: [steady(run_epochs) for run_epochs in runs] for name, runs in epochs.items()}
    figures = {name: statistics.median(values) for name, values in per_run.items()}
    global_batch = setup.batch_per_replica * int(runtime.num_replicas)
    described = (
        f"light model, synthetic MNIST, {runtime.num_replicas} replicas, global batch {global_batch}, "
        f"{setup.limit_train // global_batch} steps × {setup.epochs - 1} epochs after a warm-up epoch, "
        f"{rounds} rounds; ratio = median of each round's side / plain"
    )
    results = []
    for name, label in (
        ("headless", "tpudash run train (headless)"),
        ("tui", "TUI under Pilot, job in the engine process"),
    ):
        # Each round's side against the plain run just before it: the load
        # from other processes drifts over minutes, less within a round.
        paired = [side / plain for side, plain in zip(per_run[name], per_run["plain"])]
        ratio = statistics.median(paired)
        notes = described
        if name == "tui" and loads:

            def typical(key: str) -> float:
                return statistics.median(load[key] for load in loads)

            notes += (
                f"; during the run the dashboard's UI thread used {typical('ui_thread'):.3f} cores, "
                f"the dashboard process {typical('dashboard_process'):.3f}, the engine "
                f"{typical('engine_process'):.2f} (medians over runs)"
            )
        results.append(
            Result(
                benchmark="overhead",
                figure=f"{label} examples/s",
                value=figures[name],
                unit="ex/s",
                baseline_name="plain Keras fit",
                baseline=figures["plain"],
                ratio=ratio,
                target=f"≥ {TARGET_RATIO}",
                met=ratio >= TARGET_RATIO,
                samples={
                    "per_epoch": {"plain": epochs["plain"], name: epochs[name]},
                    "per_run": {"plain": per_run["plain"], name: per_run[name]},
                    "paired_ratios": paired,
                    **({"cpu_cores": loads} if name == "tui" else {}),
                },
                notes=notes,
            )
        )
    return results
