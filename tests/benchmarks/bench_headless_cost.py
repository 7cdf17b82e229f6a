"""What headless tpudash costs a training against plain Keras, measured inside one training: its part off and on in turn.

Separate trainings minutes apart drift more than tpudash costs (plain
Keras's epoch alone moves ±7 % between 10 s trials on a shared two-core
machine), so here one headless training (``execute_headless``: what
``tpudash run train`` calls, its live display drawn to a pseudo-terminal)
is measured against itself, seconds apart. Once its first epoch has ended,
what tpudash adds to each step is switched off and on in pairs of periods
whose order is drawn at random:

- **on**: the run as users get it: the job's Keras callback (step counts,
  running means, the per-step metric and progress events, the profiler's
  step hooks) runs at every step's start and end; the events are recorded
  to disk and drawn by the live display four times a second; telemetry is
  sampled.
- **off**: what plain Keras ``fit(verbose=0)`` does at a step: its step
  hooks run none of tpudash's work, the display is not redrawn and
  telemetry not sampled. Model, data, pipeline and steps are the same
  ones. (On TensorFlow, Keras calls step-end hooks on the training thread
  and turns the step's logs into numbers there whether or not a callback
  wants them: its backend is not thread-safe for its asynchronous
  dispatch, so plain ``fit`` does the same.)

The switch happens on the training thread at a step's start, so every step
falls wholly in one state. Each step's time is the time from its start to the
next one's, stamped by a callback that has only a step-start hook, so it
changes nothing that it measures. Steps spanning an epoch's end (validation)
are left out. What tpudash does once an epoch (its epoch events, the
TensorBoard scalars, the advice) is timed on its own and printed beside the
figure.

Each pair gives a ratio, the mean step time off ÷ on. The figure is their
median with a bootstrap 95 % interval (``tests.benchmarks.paired``). 1.000
means tpudash's headless run costs the training's steps nothing; 0.980 means
its steps are 2 % slower than plain Keras's. Prints one JSON line::

    python -m tests.benchmarks.bench_headless_cost [light|cnn] [--epochs N] [--period SECONDS]

In the suite (``python -m tests.benchmarks --only headless_cost``) both
setups run, ``TPUDASH_HEADLESS_SETUPS`` (``light,cnn``) choosing. The goal
is design.md's: ≥ 0.98, with the 95 % interval above 0.95.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import pty
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.benchmarks.bench_watch_cost import (
    DEFAULT_PERIOD_SECONDS,
    QUICK_EPOCHS,
    REPO,
    STEPS_PER_PERIOD,
    Period,
    add_training_arguments,
    frozen_over_watched,
    in_training_result,
    period_means,
)
from tests.benchmarks.harness import Result
from tests.benchmarks.paired import spread

DEFAULT_EPOCHS = {"light": 60, "cnn": 50}  # about two minutes of measured training each, on two cores
CHILD_TIMEOUT = 3600.0
PARTS = ("hooks", "display", "telemetry")
"""What the switch turns off: the job callback's step hooks (and all they emit), the display's redraws, telemetry."""
TERMINAL_SIZE = {"COLUMNS": "120", "LINES": "40"}


@dataclasses.dataclass(frozen=True)
class StepStart:
    """One step's start on the training thread: its epoch (from 0), its index in the epoch, and when."""

    epoch: int
    batch: int
    at: float


def step_intervals(starts: list[StepStart]) -> list[tuple[float, float]]:
    """(start, end) of each step: from its start to the next step's start in the same epoch.

    The last step of an epoch has no next start before the epoch's end (its validation): it is left out.
    """
    return [
        (step.at, following.at)
        for step, following in zip(starts, starts[1:], strict=False)
        if following.epoch == step.epoch and following.batch == step.batch + 1
    ]


def periods_from_switches(switches: list[tuple[float, bool, int]], end: float) -> list[Period]:
    """Periods from the (moment, on, pair) each began at; each lasts until the next begins, the last until ``end``."""
    ends = [moment for moment, _, _ in switches[1:]] + [end]
    return [
        Period(start=moment, end=until, watched=on, pair=pair)
        for (moment, on, pair), until in zip(switches, ends, strict=True)
    ]


class Switch:
    """Turns tpudash's per-step part of a headless training off and on, on the training thread.

    ``ask`` is called from the controller; the training thread applies what was
    asked at its next step's start (``at_step_start``), so a state never
    changes inside a step. What it turns off it finds as the run builds it:
    the job's callback (``switchable`` wraps its step hooks), the live
    display's redraw (``ConsoleSink``) and the telemetry loop
    (``RecordingTelemetry``).
    """

    def __init__(self, parts: tuple[str, ...] = PARTS) -> None:
        """``parts``: which of ``PARTS`` are turned off (the others run in both states: what is left is their cost)."""
        self.on = True
        self.parts = frozenset(parts)
        self.live: Any = None
        self.sampling: Any = None
        self.switches: list[tuple[float, bool, int]] = []
        """(moment, on, pair) of each period's start, in the training's clock."""
        self.cpu_at_switch: list[float] = []
        self._asked: tuple[int, bool, int] | None = None
        self._applied = 0
        self._lock = threading.Lock()

    def ask(self, on: bool, pair: int) -> None:
        with self._lock:
            serial = self._asked[0] + 1 if self._asked else 1
            self._asked = (serial, on, pair)

    def at_step_start(self, now: float) -> None:
        with self._lock:
            asked = self._asked
        if asked is None or asked[0] == self._applied:
            return
        serial, on, pair = asked
        if on != self.on:
            self._set(on)
        self._applied = serial
        self.switches.append((now, on, pair))
        self.cpu_at_switch.append(time.process_time())

    def _set(self, on: bool) -> None:
        self.on = on
        for part, owner, name in (("display", self.live, "refresh"), ("telemetry", self.sampling, "_sample_once")):
            if owner is None or part not in self.parts:
                continue
            if on:
                vars(owner).pop(name, None)
            else:
                setattr(owner, name, do_nothing)


def do_nothing(*args: Any, **kwargs: Any) -> None:
    """What a switched-off redraw or telemetry sample does."""


class ThreadSeconds:
    """The CPU seconds of the calling thread in each call of what ``timed`` wraps."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def timed(self, work: Callable[..., Any]) -> Callable[..., Any]:
        def timed_work(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return work(*args, **kwargs)
            finally:
                self.seconds.append(time.thread_time() - started)

        return timed_work


@contextlib.contextmanager
def switchable(
    switch: Switch, starts: list[StepStart], first_epoch_over: threading.Event
) -> Iterator[tuple[ThreadSeconds, ThreadSeconds]]:
    """Patch the run's parts, for the training inside, so ``switch`` can turn them off and on; stamp every step start.

    Yields the job thread's seconds in the job callback's step hooks while on, and in tpudash's epoch start and end.
    """
    import keras
    from keras.src.callbacks.callback_list import CallbackList

    from jobs.trainreport import TrainingReporter
    from tpudash.cli.sinks import ConsoleSink
    from tpudash.telemetry.recorder import RecordingTelemetry

    class StepClock(keras.callbacks.Callback):
        """Stamps each step's start, first of all callbacks; a step-start hook only: it adds no work to a step's end."""

        epoch = 0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = epoch
            if epoch >= 1:
                first_epoch_over.set()

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            now = time.time()
            switch.at_step_start(now)
            starts.append(StepStart(self.epoch, batch, now))

    step_hooks, epoch_work = ThreadSeconds(), ThreadSeconds()

    def only_when_on(hook: Callable[..., Any]) -> Callable[..., Any]:
        timed_hook = step_hooks.timed(hook)

        def hook_when_on(*args: Any, **kwargs: Any) -> Any:
            return timed_hook(*args, **kwargs) if switch.on or "hooks" not in switch.parts else None

        return hook_when_on

    original_list_init = CallbackList.__init__
    original_sink_init = ConsoleSink.__init__
    original_telemetry_init = RecordingTelemetry.__init__
    original_begin, original_end = TrainingReporter.begin_epoch, TrainingReporter.end_epoch

    def list_init(self: Any, callbacks: Any = None, *args: Any, **kwargs: Any) -> None:
        original_list_init(self, callbacks, *args, **kwargs)
        jobs_callbacks = [cb for cb in self.callbacks if type(cb).__module__ == "jobs.trainreport"]
        if not jobs_callbacks:
            return
        for callback in jobs_callbacks:
            callback.on_train_batch_begin = only_when_on(callback.on_train_batch_begin)
            callback.on_train_batch_end = only_when_on(callback.on_train_batch_end)
        clock = StepClock()
        clock.set_model(kwargs.get("model"))
        self.callbacks.insert(0, clock)

    def sink_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_sink_init(self, *args, **kwargs)
        switch.live = self._progress.live

    def telemetry_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_telemetry_init(self, *args, **kwargs)
        switch.sampling = self.loop

    patches: list[tuple[Any, str, Any]] = [
        (CallbackList, "__init__", list_init),
        (ConsoleSink, "__init__", sink_init),
        (RecordingTelemetry, "__init__", telemetry_init),
        (TrainingReporter, "begin_epoch", epoch_work.timed(original_begin)),
        (TrainingReporter, "end_epoch", epoch_work.timed(original_end)),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, replacement in patches:
        setattr(owner, name, replacement)
    try:
        yield step_hooks, epoch_work
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


@contextlib.contextmanager
def stdout_on_a_terminal() -> Iterator[None]:
    """``sys.stdout`` a pseudo-terminal drained by a thread, so rich draws its live display as a user sees it."""
    leader, follower = pty.openpty()

    def drain() -> None:
        with contextlib.suppress(OSError):
            while os.read(leader, 65536):
                pass

    drainer = threading.Thread(target=drain, daemon=True, name="pty-drain")
    drainer.start()
    terminal = io.TextIOWrapper(os.fdopen(follower, "wb", buffering=0), encoding="utf-8", write_through=True)
    saved_stdout, saved_environ = sys.stdout, {name: os.environ.get(name) for name in TERMINAL_SIZE}
    sys.stdout = terminal
    os.environ.update(TERMINAL_SIZE)
    try:
        yield
    finally:
        sys.stdout = saved_stdout
        for name, value in saved_environ.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        terminal.close()
        drainer.join(timeout=5)
        os.close(leader)


def switch_in_turn(
    switch: Switch, first_epoch_over: threading.Event, training_over: threading.Event, period: float, seed: int
) -> None:
    """The controller: once the first epoch is over, ask off and on in randomly ordered pairs until training ends."""
    chooser = random.Random(seed)
    while not first_epoch_over.wait(timeout=1.0):
        if training_over.is_set():
            return
    pair = 0
    while not training_over.is_set():
        order = [True, False]
        chooser.shuffle(order)
        for on in order:
            switch.ask(on, pair)
            if training_over.wait(timeout=period):
                return
        pair += 1


def train_switching(
    setup_name: str, epochs: int, period: float, seed: int, quick: bool, parts: tuple[str, ...] = PARTS
) -> dict:
    """The child: one headless train run with tpudash's part switched in turn; the figures."""
    from jobs import registry
    from tests.benchmarks.overhead_sides import REPLICAS, SETUPS
    from tpudash.accel.runtime import get_runtime
    from tpudash.cli.commands import execute_headless
    from tpudash.config import Settings

    full, small = SETUPS[setup_name]
    setup = dataclasses.replace(small if quick else full, epochs=epochs)
    runs_dir = Path(tempfile.mkdtemp(prefix="tpudash-headless-cost-"))
    settings = Settings(runs_dir=runs_dir)
    runtime = get_runtime(settings)
    spec = registry()["train"]
    params = spec.resolve(setup.overrides())
    switch, starts = Switch(parts), []
    first_epoch_over, training_over = threading.Event(), threading.Event()
    # At least STEPS_PER_PERIOD steps a period: the setup's steps are timed in its first epoch, so ask after it.
    controller_period = [period]

    def control() -> None:
        first_epoch_over.wait()
        steps = [end - start for start, end in step_intervals(list(starts))]
        if steps:
            controller_period[0] = max(period, STEPS_PER_PERIOD * statistics.median(steps))
        switch_in_turn(switch, first_epoch_over, training_over, controller_period[0], seed)

    controller = threading.Thread(target=control, daemon=True, name="switch-controller")
    with switchable(switch, starts, first_epoch_over) as (step_hooks, epoch_work):
        controller.start()
        try:
            with stdout_on_a_terminal():
                code = execute_headless(spec, params, runtime, settings, runs_dir, as_json=False)
        finally:
            training_over.set()
            first_epoch_over.set()
            controller.join(timeout=10)
    if code != 0:
        raise RuntimeError(f"the headless train run exited {code}: see {runs_dir}")
    steps = step_intervals(starts)
    steps_per_epoch = setup.steps_per_epoch(REPLICAS)
    periods = periods_from_switches(switch.switches, starts[-1].at if starts else time.time())
    (runs_dir / "periods_and_steps.json").write_text(
        json.dumps({"periods": [dataclasses.asdict(p) for p in periods], "steps": steps})
    )
    means = period_means(periods, steps)
    ratios = frozen_over_watched(means)
    figure = spread(ratios)
    cores = process_cores(periods, switch.cpu_at_switch)
    step_ms = {
        on: round(statistics.median(pair[on] for pair in means.values() if on in pair) * 1000, 2)
        for on in (True, False)
        if any(on in pair for pair in means.values())
    }
    epoch_ms = sum(epoch_work.seconds) * 1000 / epochs
    # Two hooks a step (its start and its end), the first epoch's steps (their first calls) left out.
    measured_hooks = step_hooks.seconds[2 * steps_per_epoch :]
    hook_ms = sum(measured_hooks) * 1000 * 2 / len(measured_hooks) if measured_hooks else None
    return {
        "setup": setup_name,
        "epochs": epochs,
        "parts_switched": list(parts),
        "period_seconds": round(controller_period[0], 3),
        "pairs": len(ratios),
        "off_over_on": figure.text(),
        "median": round(figure.median, 4),
        "interval": [round(figure.low, 4), round(figure.high, 4)],
        "step_ms_on": step_ms.get(True),
        "step_ms_off": step_ms.get(False),
        "process_cores_on": cores.get(True),
        "process_cores_off": cores.get(False),
        "steps_per_epoch": steps_per_epoch,
        "step_hooks_ms": round(hook_ms, 3) if hook_ms is not None else None,
        "epoch_work_ms": round(epoch_ms, 3),
        "ratios": [round(ratio, 4) for ratio in ratios],
        "raw": str(runs_dir / "periods_and_steps.json"),
    }


def process_cores(periods: list[Period], cpu_at_switch: list[float]) -> dict[bool, float]:
    """The whole process's CPU seconds per second in each state, over all its whole periods."""
    cpu: dict[bool, float] = {}
    wall: dict[bool, float] = {}
    for period, cpu_start, cpu_end in zip(periods, cpu_at_switch, cpu_at_switch[1:], strict=False):
        cpu[period.watched] = cpu.get(period.watched, 0.0) + cpu_end - cpu_start
        wall[period.watched] = wall.get(period.watched, 0.0) + period.end - period.start
    return {on: round(cpu[on] / wall[on], 3) for on in cpu if wall[on] > 0}


def measure(
    setup_name: str, epochs: int, period: float, seed: int, quick: bool = False, parts: tuple[str, ...] = PARTS
) -> dict:
    """Run the child (TensorFlow and its threads stay out of this process); its JSON line."""
    argv = [sys.executable, "-m", "tests.benchmarks.bench_headless_cost", "--trainer", setup_name]
    argv += ["--epochs", str(epochs), "--period", str(period), "--seed", str(seed), "--parts", ",".join(parts)]
    argv += ["--quick"] if quick else []
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    completed = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False
    )
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines:
        raise RuntimeError(f"the training child exited {completed.returncode}: {completed.stderr[-2000:]}")
    return json.loads(lines[-1])


def run(quick: bool) -> list[Result]:
    """The suite's rows: one per setup, plain Keras's steps ÷ headless tpudash's, within one training."""
    names = os.environ.get("TPUDASH_HEADLESS_SETUPS", "light,cnn").split(",")
    results = []
    for setup_name in (name.strip() for name in names if name.strip()):
        epochs = QUICK_EPOCHS if quick else DEFAULT_EPOCHS[setup_name]
        measured = measure(setup_name, epochs, DEFAULT_PERIOD_SECONDS, seed=0, quick=quick)
        results.append(
            in_training_result(
                "headless_cost",
                f"{setup_name}: step time plain Keras ÷ headless tpudash, in one training",
                measured,
                f"{measured['off_over_on']}; {epochs} epochs, {measured['period_seconds']} s periods; "
                f"steps {measured['step_ms_off']} ms off, {measured['step_ms_on']} ms on (medians of periods); "
                f"the process {measured['process_cores_off']} cores off, {measured['process_cores_on']} on; "
                f"the job thread in tpudash's step hooks {measured['step_hooks_ms']} ms a step, in its epoch "
                f"start and end {measured['epoch_work_ms']} ms an epoch of {measured['steps_per_epoch']} steps",
            )
        )
    return results


def main(argv: list[str]) -> int:
    from tests.benchmarks.overhead_sides import SETUPS

    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_headless_cost", description=__doc__.splitlines()[0]
    )
    add_training_arguments(parser, tuple(SETUPS), "light 60, cnn 50")
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help="what is switched off, of %(default)s (the rest runs throughout: one part alone is its own cost)",
    )
    parser.add_argument("--trainer", choices=tuple(SETUPS), help=argparse.SUPPRESS)  # the child this runs
    args = parser.parse_args(argv)
    setup_name = args.trainer or args.setup
    if args.epochs is None:
        args.epochs = QUICK_EPOCHS if args.quick else DEFAULT_EPOCHS[setup_name]
    if args.epochs < 2:
        parser.error(f"--epochs: at least 2 (the first is not measured), got {args.epochs}")
    if args.period <= 0:
        parser.error(f"--period: seconds above 0, got {args.period}")
    parts = tuple(part.strip() for part in args.parts.split(",") if part.strip())
    unknown = [part for part in parts if part not in PARTS]
    if unknown or not parts:
        parser.error(f"--parts: {', '.join(unknown) or 'none given'}; allowed: one or more of {', '.join(PARTS)}")
    if args.trainer:
        figures = train_switching(args.trainer, args.epochs, args.period, args.seed, args.quick, parts)
    else:
        figures = measure(setup_name, args.epochs, args.period, args.seed, args.quick, parts)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
