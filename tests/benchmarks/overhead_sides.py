"""One side of the overhead benchmark in a process of its own: plain Keras ``fit``, headless tpudash, or the TUI.

``bench_overhead`` starts this file as a script, one training per process,
sides interleaved round after round, each with the working directory (and
so the code) of the tree it measures::

    python tests/benchmarks/overhead_sides.py --side headless --setup cnn --code /tmp/base-ef7

- **plain**: what a user would write without tpudash: ``jobs.models.build_model``
  under ``strategy.scope()``, the same compile (Adam, sparse categorical
  cross-entropy, accuracy, steps_per_execution 1), the same ``jobs.datasets``
  synthetic data and ``training_pipeline``, distributed as the train job does
  on a CPU (one host pipeline per replica through
  ``distribute_datasets_from_function``, the job's ``InputOptions``: checked
  against ``jobs.trainplan.input_options``), ``model.fit(verbose=0)``, and
  the same validation after every epoch (one pass over the distributed test
  split with a ``strategy.run`` step, like the job's Evaluator).
- **headless**: ``python -m tpudash run train --set …`` started with ``--code``
  as its working directory (that tree's tpudash and jobs win over the
  installed copy), its rich live display drawing to a pseudo-terminal that
  this process drains, the run recorded to disk as usual. Only the command
  line is used, so any commit that has ``run train --set`` can be measured.
- **headless-pipe**: the same into a pipe: no live display (what the display costs).
- **tui**: ``TpudashApp`` under Pilot (120×40, headless driver) as users get
  it: the job in the engine process the app starts, the run view drawn live.

Every side reports the same figures, read the same way: examples/s of each
epoch's training part (tpudash's ``examples_per_second`` metric, defined so),
the wall-clock moment each epoch ended (after its validation: tpudash's
epoch ``Progress`` event, the plain script's ``on_epoch_end``), and the CPU
time of this whole process tree (this process, its children and theirs,
user + system) sampled every 20 ms and interpolated at those moments. The
marginal epoch (epochs 2…N, what ``(T(N) − T(1)) / (N − 1)`` measures) is
read between the end of epoch 1 and the end of epoch N, so tracing, the
cache fill, start-up and shutdown stay out of it. The last line printed is
the JSON of those figures.

Self-contained on purpose (no ``tests`` imports): with ``--code`` set to an
old commit's tree, only that tree's ``tpudash`` and ``jobs`` are importable.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil


@dataclass(frozen=True)
class TrainingSetup:
    """One training, described once, run identically on every side."""

    batch_per_replica: int
    limit_train: int
    limit_test: int
    epochs: int
    dataset: str = "mnist"
    model: str = "light"
    seed: int = 42
    learning_rate: float = 0.001

    def overrides(self) -> dict[str, str]:
        """The job's params as ``--set`` text (everything else at its default: fit loop, float32, adam)."""
        return {
            "dataset": self.dataset,
            "source": "synthetic",
            "model": self.model,
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

    def steps_per_epoch(self, replicas: int) -> int:
        return self.limit_train // (self.batch_per_replica * replicas)


# The light model: 40 steps per epoch on 8 replicas (global batch 512). Five epochs: (T(5) − T(1)) / 4 as issue 37 measures.
FULL = TrainingSetup(batch_per_replica=64, limit_train=20_480, limit_test=512, epochs=5)
QUICK = TrainingSetup(batch_per_replica=8, limit_train=640, limit_test=64, epochs=2)
# The Colab walkthrough's CIFAR-10 CNN: 8,192 examples, 64 per replica × 8 replicas = 16 steps per epoch.
CNN = TrainingSetup(
    batch_per_replica=64, limit_train=8_192, limit_test=1_024, epochs=5, dataset="cifar10", model="cifar-cnn"
)
CNN_QUICK = TrainingSetup(
    batch_per_replica=64, limit_train=8_192, limit_test=512, epochs=2, dataset="cifar10", model="cifar-cnn"
)
SETUPS = {"light": (FULL, QUICK), "cnn": (CNN, CNN_QUICK)}
REPLICAS = 8


# -- CPU time of the process tree -------------------------------------------------------------


def tree_cpu_seconds(process: psutil.Process, children: list[psutil.Process]) -> float:
    """User + system seconds of ``process``, its reaped children, and ``children`` still alive."""
    times = process.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in children:
        with contextlib.suppress(psutil.Error):
            child_times = child.cpu_times()
            total += child_times.user + child_times.system
    return total


class TreeCpuSampler(threading.Thread):
    """Samples (wall time, CPU seconds of the process tree) every ``interval`` s; ``at(t)`` interpolates."""

    def __init__(self, interval: float = 0.02) -> None:
        super().__init__(daemon=True, name="tree-cpu-sampler")
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._stopping = threading.Event()
        self._process = psutil.Process()

    def run(self) -> None:
        children: list[psutil.Process] = []
        listed = 0.0
        while not self._stopping.is_set():
            now = time.time()
            if now - listed > 0.5:  # listing every process is the costly part: twice a second
                with contextlib.suppress(psutil.Error):
                    children = self._process.children(recursive=True)
                listed = now
            self.samples.append((time.time(), tree_cpu_seconds(self._process, children)))
            self._stopping.wait(self.interval)

    def stop(self) -> None:
        """Stop sampling, with one last sample now: the thread may have been starved of the GIL at the end."""
        self._stopping.set()
        self.join()
        self.samples.append((time.time(), tree_cpu_seconds(self._process, self._process.children(recursive=True))))

    def at(self, moment: float) -> float:
        """CPU seconds at wall time ``moment``, linear between the samples either side."""
        samples = self.samples
        for (t0, c0), (t1, c1) in zip(samples, samples[1:]):
            if t0 <= moment <= t1:
                return c0 if t1 == t0 else c0 + (c1 - c0) * (moment - t0) / (t1 - t0)
        raise ValueError(f"no CPU samples around {moment} (sampled {samples[0][0]}…{samples[-1][0]})")


# -- plain Keras ----------------------------------------------------------------------------------


def cpu_input_options(tf):
    """How the train job distributes its input on CPU replicas, spelled out as a user would.

    One host pipeline per replica (``PER_REPLICA``, per-replica batches over
    a shard of the data, no copy to a device), built by
    ``distribute_datasets_from_function``: what the train job does on a CPU.
    If the job changes its choice, this benchmark stops rather than compare
    two different things.
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


def plain_keras_throughputs(
    runtime, setup: TrainingSetup, constant_input: bool = False, epoch_ends: list[float] | None = None
) -> list[float]:
    """Examples/s of each epoch's training part, with nothing but Keras watching.

    ``constant_input`` feeds every replica one batch from its pipeline over
    and over (``take(1).cache().repeat()``): training with free input, the
    ceiling the input pipeline is compared with. ``epoch_ends`` receives the
    wall time at which each epoch ended, its validation done.
    """
    import keras
    import tensorflow as tf

    from jobs import datasets as data
    from jobs.models import MODELS, build_model

    strategy = runtime.strategy
    global_batch = setup.batch_per_replica * int(strategy.num_replicas_in_sync)
    keras.utils.set_random_seed(setup.seed)
    splits = data.load_splits(
        setup.dataset, "synthetic", limit_train=setup.limit_train, limit_test=setup.limit_test, seed=setup.seed
    )
    steps_per_epoch = splits.train_examples // global_batch
    from_logits = MODELS[setup.model].from_logits
    options = cpu_input_options(tf)
    with strategy.scope():
        model = build_model(setup.model, splits.shape.image_shape, splits.shape.num_classes)
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
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds = time.perf_counter() - self.started
            self.throughputs.append(steps_per_epoch * global_batch / seconds)
            val_loss.reset_state()
            val_accuracy.reset_state()
            for inputs in test:
                validation_step(inputs)
            self.last_validation = {"loss": float(val_loss.result()), "accuracy": float(val_accuracy.result())}
            if epoch_ends is not None:
                epoch_ends.append(time.time())

    timer = EpochTimer()
    model.fit(train, epochs=setup.epochs, steps_per_epoch=steps_per_epoch, callbacks=[timer], verbose=0, shuffle=False)
    return timer.throughputs


def steady(throughputs: list[float]) -> float:
    """A run's figure: the median over epochs after the first."""
    import statistics

    rest = throughputs[1:] or throughputs
    return statistics.median(rest)


# -- reading a recorded run without tpudash (any commit's layout) ---------------------------------


def recorded_epochs(runs_dir: Path) -> tuple[list[float], list[float]]:
    """(examples/s per epoch, wall time each epoch ended) from the one run under ``runs_dir``.

    Reads the event lines themselves (an appended ``events.jsonl`` or
    ``events/*.jsonl`` segments), so the same reader serves every commit.
    """
    run_dirs = [path.parent for path in runs_dir.rglob("run.json")]
    if len(run_dirs) != 1:
        raise RuntimeError(f"expected one run under {runs_dir}, found {len(run_dirs)}")
    run_dir = run_dirs[0]
    status = json.loads((run_dir / "run.json").read_text()).get("status")
    if status != "done":
        raise RuntimeError(f"the train run ended {status}")
    files = [run_dir / "events.jsonl", *sorted((run_dir / "events").glob("*.jsonl"))]
    throughputs: list[tuple[float, float]] = []
    ends: list[tuple[int, float]] = []
    for path in files:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("type") == "metric" and event.get("name") == "examples_per_second":
                    throughputs.append((event["t"], event["value"]))
                elif event.get("type") == "progress" and event.get("unit") == "epoch" and event.get("done"):
                    ends.append((event["done"], event["t"]))
    return [value for _, value in sorted(throughputs)], [t for _, t in sorted(ends)]


# -- the sides ------------------------------------------------------------------------------------


def run_plain(setup: TrainingSetup) -> tuple[list[float], list[float]]:
    from tpudash.accel.runtime import get_runtime
    from tpudash.config import Settings

    runtime = get_runtime(Settings())
    ends: list[float] = []
    return plain_keras_throughputs(runtime, setup, epoch_ends=ends), ends


def run_headless(setup: TrainingSetup, code: Path, terminal: bool = True) -> tuple[list[float], list[float]]:
    """``python -m tpudash run train`` from ``code``, drawing to a pseudo-terminal drained here (else a pipe).

    Into a pipe rich draws no live display: the difference is what the
    display costs.
    """
    import pty
    import subprocess

    runs_dir = Path(tempfile.mkdtemp(prefix="tpudash-bench-headless-"))
    argv = [sys.executable, "-m", "tpudash", "run", "train", "--runs-dir", str(runs_dir)]
    for name, value in setup.overrides().items():
        argv += ["--set", f"{name}={value}"]
    leader, follower = pty.openpty() if terminal else os.pipe()
    os.set_blocking(leader, True)

    def drain() -> None:
        with contextlib.suppress(OSError):
            while os.read(leader, 65536):
                pass

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    env = dict(os.environ, COLUMNS="120", LINES="40")
    completed = subprocess.run(argv, cwd=code, stdout=follower, stderr=subprocess.PIPE, env=env, check=False)
    os.close(follower)
    if completed.returncode != 0:
        raise RuntimeError(f"tpudash run train exited {completed.returncode}: {completed.stderr.decode()[-2000:]}")
    return recorded_epochs(runs_dir)


def run_tui(setup: TrainingSetup) -> tuple[list[float], list[float]]:
    """The TUI under Pilot launches train in its engine process and shows it live until it ends."""
    import asyncio

    from tpudash.config import Settings
    from tpudash.tui.app import TpudashApp

    runs_dir = Path(tempfile.mkdtemp(prefix="tpudash-bench-tui-"))

    async def drive() -> None:
        app = TpudashApp(
            Settings(runs_dir=runs_dir), freeze_after_start=True
        )  # as run_app makes it: the collector settled
        async with app.run_test(size=(120, 40)) as pilot:
            await asyncio.wait_for(app.runtime_settled.wait(), 900)
            if app.runtime is None:
                raise RuntimeError(f"the engine has no runtime: {app.runtime_error}")
            live = app.session.launch_by_name("train", setup.overrides())
            if live is None:
                raise RuntimeError(f"the TUI refused the launch: {app.notices[-1:]}")
            await asyncio.wait_for(live.settled.wait(), 900)
            await pilot.pause()

    asyncio.run(drive())
    # The engine records the run's end and exits on its own; the next
    # measurement must not share the cores with it.
    psutil.wait_procs(psutil.Process().children(recursive=True), timeout=60)
    return recorded_epochs(runs_dir)


def measure(side: str, setup: TrainingSetup, code: Path) -> dict[str, Any]:
    """One training on ``side``: per-epoch examples/s, the marginal epoch's wall and tree-CPU seconds."""
    sampler = TreeCpuSampler()
    sampler.start()
    try:
        if side == "plain":
            throughputs, ends = run_plain(setup)
        elif side in ("headless", "headless-pipe"):
            throughputs, ends = run_headless(setup, code, terminal=side == "headless")
        else:
            throughputs, ends = run_tui(setup)
    finally:
        sampler.stop()
    if len(ends) != setup.epochs or len(throughputs) != setup.epochs:
        raise RuntimeError(f"expected {setup.epochs} epochs, read {len(throughputs)} rates and {len(ends)} ends")
    marginal_epochs = setup.epochs - 1
    steps = setup.steps_per_epoch(REPLICAS) * marginal_epochs
    wall = ends[-1] - ends[0]
    cpu = sampler.at(ends[-1]) - sampler.at(ends[0])
    return {
        "side": side,
        "code": str(code),
        "throughputs": throughputs,
        "steady_examples_per_second": steady(throughputs),
        "marginal_epoch_seconds": wall / marginal_epochs,
        "cpu_seconds_per_step": cpu / steps,
        "wall_seconds_per_step": wall / steps,
        "cpu_cores": cpu / wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=("plain", "headless", "headless-pipe", "tui"), required=True)
    parser.add_argument("--setup", choices=tuple(SETUPS), required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--code", type=Path, required=True, help="the tree whose tpudash and jobs are measured")
    args = parser.parse_args(argv)
    code = args.code.resolve()
    sys.path.insert(0, str(code))  # that tree's tpudash and jobs, not the installed copy
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TFDS_DISABLE_GCS", "1")
    # An engine lock of its own: another dashboard on this machine must not hold this one's engine back.
    os.environ["TPUDASH_ENGINE_LOCK"] = str(Path(tempfile.mkdtemp(prefix="tpudash-bench-lock-")) / "engine.lock")
    full, quick = SETUPS[args.setup]
    result = measure(args.side, quick if args.quick else full, code)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
