"""Target: on Keras over JAX, recording a user's ``fit`` costs it nothing — with ``TpudashCallback`` ≥ 0.98 × without.

What Colab's TPU runtime runs: Keras 3 on the JAX backend, the model's
variables laid out by ``keras.distribution.DataParallel`` over every device.
Here the CPU stands in for the chips, split by XLA into 8 host devices. The
measurement runs in a child process of this Python (it must have JAX and
Keras; the variables below are set before either is imported), so it runs
the same from ``python -m tests.benchmarks --only keras_jax`` in the JAX
environment whatever the parent process has imported:

- **the model**: a multi-layer perceptron (256 → 256 → 256 → 10, about
  135 k parameters) built under DataParallel over the 8 devices, compiled
  with Adam, sparse categorical cross-entropy on logits and accuracy; a
  step of a few milliseconds. Built, compiled and traced once (a warm-up
  ``fit`` of one epoch); both sides train that same model.
- **the data**: random numpy features and labels of 10 classes, handed to
  ``fit`` as arrays (Keras shards each batch over the devices).
- **without**: ``model.fit(x, y, batch_size=B, epochs=E, verbose=0,
  callbacks=[timer])``; **with**: the same with
  ``TpudashCallback(runs_dir=<temp dir>, batch_size=B)`` before the timer: its
  defaults (a batch point at most ten times a second, a per-device value
  each epoch). Each such run must say ``done``, with examples/s for every
  epoch and one per-device value of 8 per epoch.

Both sides keep Keras' batch ends on its thread pool (the timer has only an
epoch hook; the callback is ``async_safe``). The timer notes every epoch's
end; a trial's figure is examples over the epochs after the first. Trials
alternate without, with, …; the ratio is the median with ÷ the median
without (the median of paired ratios is in the notes).
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.benchmarks.harness import Result
from tests.jax.stand_in import DEVICES, stand_in_environment

REPO_ROOT = Path(__file__).resolve().parents[2]
TARGET_RATIO = 0.98
FEATURES = 256
HIDDEN = 256
CLASSES = 10


@dataclass(frozen=True)
class Setup:
    global_batch: int
    steps_per_epoch: int
    epochs: int  # per fit; the first is left out
    trials: int  # per side
    seed: int = 7


FULL = Setup(global_batch=256, steps_per_epoch=60, epochs=5, trials=7)
QUICK = Setup(global_batch=32, steps_per_epoch=4, epochs=2, trials=1)


def run(quick: bool) -> list[Result]:
    python = jax_python()
    setup = QUICK if quick else FULL
    # 8 host devices, and XLA's pool big enough for their all-reduce on two cores (tests/jax/stand_in.py).
    environment = stand_in_environment(os.environ)
    environment["KERAS_BACKEND"] = "jax"
    environment.setdefault("JAX_PLATFORMS", "cpu")
    child = subprocess.run(
        [python, "-m", "tests.benchmarks.bench_keras_jax", json.dumps(asdict(setup))],
        cwd=REPO_ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        text=True,
        timeout=1800,
        check=False,
    )
    if child.returncode != 0:
        raise RuntimeError(f"the measuring process ended with {child.returncode} (its stderr is above)")
    measured = json.loads(child.stdout.strip().splitlines()[-1])
    return results(setup, measured)


def jax_python() -> str:
    """This Python when it has JAX and Keras, else the JAX environment CI makes beside the checkout (.venv-jax)."""
    if importlib.util.find_spec("jax") is not None and importlib.util.find_spec("keras") is not None:
        return sys.executable
    beside = REPO_ROOT / ".venv-jax" / "bin" / "python"
    if beside.exists():
        return str(beside)
    raise RuntimeError(
        "JAX or Keras is not installed in this Python, and there is no .venv-jax beside the checkout: "
        'python3 -m venv .venv-jax && .venv-jax/bin/pip install ".[jax,test]", then run it again'
    )


def results(setup: Setup, measured: dict) -> list[Result]:
    rates_without, rates_with = measured["without"], measured["with"]
    figure_without, figure_with = statistics.median(rates_without), statistics.median(rates_with)
    ratio = figure_with / figure_without
    paired = [side / base for side, base in zip(rates_with, rates_without)]
    described = (
        f"Keras {measured['keras']} on JAX {measured['jax']}, DataParallel over {measured['devices']} CPU devices; "
        f"an MLP of {measured['parameters']:,} parameters, global batch {setup.global_batch}, a step of "
        f"{measured['step_ms']:.1f} ms; {setup.steps_per_epoch} steps × {setup.epochs - 1} epochs after each fit's "
        f"first, {setup.trials} trials per side alternated; trials without {min(rates_without):,.0f}–"
        f"{max(rates_without):,.0f} ex/s, with {min(rates_with):,.0f}–{max(rates_with):,.0f}; median of paired "
        f"ratios {statistics.median(paired):.3f} (range {min(paired):.3f}–{max(paired):.3f}); batch points per run "
        f"{statistics.median(measured['batch_points']):.0f}"
    )
    return [
        Result(
            benchmark="keras_jax",
            figure="Keras-on-JAX fit with TpudashCallback (defaults, batch_size) examples/s",
            value=figure_with,
            unit="ex/s",
            baseline_name="the same fit without it",
            baseline=figure_without,
            ratio=ratio,
            target=f"≥ {TARGET_RATIO} ×",
            met=ratio >= TARGET_RATIO,
            samples={"without": rates_without, "with": rates_with, "paired_ratios": paired, **measured["extra"]},
            notes=described,
        ),
    ]


# -- the measuring process -------------------------------------------------------------------


def measure(setup: Setup) -> dict:
    import gc
    import time

    import jax
    import keras
    import numpy as np

    from tpudash.callbacks import TpudashCallback

    class EpochTimer(keras.callbacks.Callback):
        # Only an epoch hook: Keras keeps batch ends on its pool, as it does for TpudashCallback.
        def __init__(self):
            super().__init__()
            self.ends: list[float] = []

        def on_epoch_end(self, epoch, logs=None):
            self.ends.append(time.perf_counter())

    devices = jax.devices()
    if len(devices) != DEVICES:
        raise RuntimeError(f"{len(devices)} devices, not {DEVICES}: XLA_FLAGS was set after JAX started")
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    keras.utils.set_random_seed(setup.seed)
    generator = np.random.default_rng(setup.seed)
    count = setup.global_batch * setup.steps_per_epoch
    features = generator.normal(size=(count, FEATURES)).astype("float32")
    labels = generator.integers(0, CLASSES, size=(count,)).astype("int32")
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(CLASSES),
        ],
        name="mlp",
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    fit_options = {"batch_size": setup.global_batch, "verbose": 0, "shuffle": False}
    model.fit(features, labels, epochs=1, **fit_options)  # warm-up: traced on neither side's clock

    def trial(extra: list) -> float:
        timer = EpochTimer()
        gc.collect()  # the previous fit's garbage collected here, not inside this one
        started = time.perf_counter()
        model.fit(features, labels, epochs=setup.epochs, callbacks=[*extra, timer], **fit_options)
        ends = [started, *timer.ends]
        steady = [end - begin for begin, end in zip(ends, ends[1:])][1:] or [ends[-1] - started]
        return len(steady) * count / sum(steady)

    runs_dir = Path(tempfile.mkdtemp(prefix="tpudash-bench-keras-jax-"))
    without: list[float] = []
    with_callback: list[float] = []
    batch_points: list[int] = []
    for number in range(setup.trials):
        without.append(trial([]))
        callback = TpudashCallback(runs_dir=runs_dir, batch_size=setup.global_batch)
        with_callback.append(trial([callback]))
        batch_points.append(check_recorded(callback, setup))
        print(
            f"[keras_jax] trial {number + 1}/{setup.trials}: without {without[-1]:,.0f} ex/s, "
            f"with {with_callback[-1]:,.0f} ex/s ({batch_points[-1]} batch points)",
            file=sys.stderr,
            flush=True,
        )
    keras.distribution.set_distribution(None)
    return {
        "without": without,
        "with": with_callback,
        "batch_points": batch_points,
        "devices": len(devices),
        "parameters": int(model.count_params()),
        "step_ms": 1000 * setup.global_batch / statistics.median(without),
        "jax": jax.__version__,
        "keras": keras.__version__,
        "extra": {"runs_dir": str(runs_dir)},
    }


def check_recorded(callback, setup: Setup) -> int:
    """The callback's run: done, examples/s every epoch, 8 per-device values every epoch; its batch points."""
    run = callback.run
    if run is None:
        raise RuntimeError("TpudashCallback recorded no run")
    meta = json.loads((Path(run.run_dir) / "run.json").read_text())
    if meta.get("status") != "done":
        raise RuntimeError(f"run {run.run_id} says {meta.get('status')!r}, not 'done' ({meta.get('error')})")
    counts = {"batch_loss": 0, "examples_per_second": 0, "per_device": 0}
    with open(Path(run.run_dir) / "events.jsonl") as events:
        for line in events:
            event = json.loads(line)
            if event.get("type") == "metric" and event.get("name") in counts:
                counts[event["name"]] += 1
            elif event.get("type") == "replica_values" and len(event.get("values", [])) == DEVICES:
                counts["per_device"] += 1
    if counts["examples_per_second"] != setup.epochs or counts["per_device"] != setup.epochs:
        raise RuntimeError(f"run {run.run_id}: {counts} for {setup.epochs} epochs")
    return counts["batch_loss"]


if __name__ == "__main__":
    print(json.dumps(measure(Setup(**json.loads(sys.argv[1])))), flush=True)
