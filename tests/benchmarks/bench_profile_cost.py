"""Target: a run nobody profiles pays ≤ 0.5 % of a step for being profilable (issue 39, item 6).

What an engine run pays while no one asks for a profile, measured side by side in one process
on the 8-replica CPU runtime (the project's TPU stand-in):

- **the step**: the Colab TPU walkthrough's CIFAR-10 CNN (``cifar-cnn``, as ``bench_callback``
  builds, compiles, feeds and warms it), trained by ``fit`` at global batch 128; its step time is
  the median over alternated trials of the steady epochs' time per step.
- **the hooks**: what the train job calls per execution through ``jobs.trainplan.ProfileWindow``
  with the runner's responder (``tpudash.profiles.capture.ProfileResponder``, TensorFlow's real
  step marker ``tf.profiler.experimental.Trace("train", step_num=…, _r=1)``, no request pending):
  ``before`` (``step_begin``, marker entered) and ``after`` (marker left, ``step_end``). Timed in
  a tight loop of many calls, alternated with the same loop on a window without a profiler
  (``before``/``after`` that return at once): the difference per step.
- **the request check**: the responder's poller looks at ``profile/requests/`` once a second on
  its own thread (one listing of a local run's folder); one look is timed, and counted as its
  share of a second (on 2 loaded cores it takes CPU from training whichever thread runs it).

The figure is (hooks per step + one look × step seconds / 1 s) ÷ step time. Beside it, in the
notes: the same fit with and without a callback that calls the window as the train job does,
alternated (its ratio is within the machine's noise, far wider than 0.5 %: informative only).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.benchmarks.harness import Result

TARGET_PERCENT = 0.5


def hook_loop(window: Any, calls: int) -> float:
    """Seconds per step of ``calls`` executions' worth of the window's hooks."""
    started = time.perf_counter()
    for step in range(1, calls + 1):
        window.before(step, step)
        window.after(step)
    return (time.perf_counter() - started) / calls


class QuietContext:
    """What ProfileWindow needs of a job's context: a log (never called while no profile is taken)."""

    def log(self, text: str, level: str = "info") -> None:
        print(f"[profile_cost] {level}: {text}", file=sys.stderr)


def hooks_fit_callback(keras: Any, window: Any) -> Any:
    """Calls the window around each batch as the train job's reporting callback does."""

    class Hooks(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.step = 0

        def on_train_batch_begin(self, batch, logs=None):
            window.before(self.step + 1, self.step + 1)

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            window.after(self.step)

    return Hooks()


def run(quick: bool) -> list[Result]:
    import keras

    from jobs.trainplan import ProfileWindow
    from tests.benchmarks.bench_callback import prepare, train
    from tpudash.profiles.capture import ProfileResponder
    from tpudash.runs.backends import LocalRunFiles

    setup, strategy, global_batch, data, model, parameters = prepare(quick)
    run_dir = Path(tempfile.mkdtemp(prefix="tpudash-bench-profile-cost-"))
    files = LocalRunFiles(run_dir)
    # Not started: no poller thread taking CPU while the hooks are timed; its look is timed on its own.
    responder = ProfileResponder(files, framework="tensorflow", local_root=run_dir)
    context = QuietContext()
    profiled = ProfileWindow(context, None, run_dir / "tensorboard", responder)
    bare = ProfileWindow(context, None, run_dir / "tensorboard")  # no profiler, no window: returns at once

    model.fit(data, epochs=1, steps_per_epoch=setup.steps_per_epoch, verbose=0, shuffle=False)  # warm-up
    hook_loop(profiled, 1000)  # TensorFlow's Trace imported and warmed

    calls = 2_000 if quick else 50_000
    rounds = 2 if quick else 7
    with_hooks, without_hooks = [], []
    for _ in range(rounds):  # alternated: load on the shared cores hits both alike
        without_hooks.append(hook_loop(bare, calls))
        with_hooks.append(hook_loop(profiled, calls))
    hook_seconds = statistics.median(w - b for w, b in zip(with_hooks, without_hooks))

    looks = []
    for _ in range(5 if quick else 50):
        started = time.perf_counter()
        responder.poll_now()
        looks.append(time.perf_counter() - started)
    look_seconds = statistics.median(looks)

    fits_without, fits_with = [], []
    for _ in range(setup.trials):
        fits_without.append(train(model, data, setup, global_batch, []))
        fits_with.append(train(model, data, setup, global_batch, [hooks_fit_callback(keras, profiled)]))
    rate_without = statistics.median(trial.examples_per_second for trial in fits_without)
    rate_with = statistics.median(trial.examples_per_second for trial in fits_with)
    step_seconds = global_batch / rate_without
    responder.close()

    per_step = hook_seconds + look_seconds * step_seconds / responder.poll_seconds
    percent = 100 * per_step / step_seconds
    notes = (
        f"cifar-cnn ({parameters:,} params) on {int(strategy.num_replicas_in_sync)} CPU replicas, global batch "
        f"{global_batch}: step {step_seconds * 1000:.1f} ms (median of {setup.trials} fits); hooks per step "
        f"{hook_seconds * 1e6:.2f} µs (TF step marker + step_begin/step_end, {calls:,} calls × {rounds} rounds "
        f"alternated with a window without profiler, whose own cost is {statistics.median(without_hooks) * 1e6:.2f} "
        f"µs); one look for requests {look_seconds * 1e6:.0f} µs, once a second; "
        f"fit with the hooks ÷ without (alternated, noisy): {rate_with / rate_without:.3f}; "
        f"hooks and look: {100 * (hook_seconds + look_seconds * step_seconds) / step_seconds:.4f} % of a step"
    )
    print(f"[profile_cost] {notes}", file=sys.stderr)
    return [
        Result(
            benchmark="profile_cost",
            figure="an unprofiled run's profiling hooks and request check, per step",
            value=per_step * 1e6,
            unit="µs",
            baseline_name="cifar-cnn step",
            baseline=step_seconds * 1e6,
            ratio=per_step / step_seconds,
            target=f"≤ {TARGET_PERCENT} % of a step",
            met=percent <= TARGET_PERCENT,
            samples={
                "hooks_with_seconds": with_hooks,
                "hooks_without_seconds": without_hooks,
                "look_seconds": looks,
                "fit_examples_per_second": {
                    "without": [trial.examples_per_second for trial in fits_without],
                    "with": [trial.examples_per_second for trial in fits_with],
                },
            },
            notes=notes,
        )
    ]
