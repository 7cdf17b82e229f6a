"""Target 1: watching costs nothing — training under tpudash ≥ 0.98 × a plain Keras ``fit``.

The same training on an 8-replica CPU runtime, several ways, each in a
process of its own (``tests/benchmarks/overhead_sides.py`` says what each
side runs and how it is read): plain Keras ``fit``, headless
``tpudash run train``, and the TUI with the job in its engine process.
With ``TPUDASH_OVERHEAD_BASE`` set to another tree (a ``git worktree`` of an
older commit), that tree's headless and dashboard sides run too, in the same rounds.

Many short rounds, every side once per round in a shuffled order, so the
load other processes put on a shared two-core machine (which drifts over
minutes) hits a round's sides alike. Each round's side is divided by the
same round's plain run, and the rounds' ratios are summarised as their
median with a bootstrap 95 % interval and the IQR (``tests.benchmarks.paired``).
Three figures per side:

- **marginal epoch**: the wall time of epochs 2…N (from the end of epoch 1's
  validation to the end of epoch N's), per epoch: what
  ``(T(N epochs) − T(1 epoch)) / (N − 1)`` measures, per-epoch costs
  (validation, run.json, TensorBoard) included. Ratio = plain / side, so
  above 1 is faster than plain.
- **examples/s** of epochs ≥ 2's training parts (median over epochs).
- **CPU per step**: user + system seconds of the side's whole process tree
  (its children included: the CLI, the TUI's engine) over the marginal
  epochs, per step. Ratio = side / plain: above 1 costs more CPU.

Two setups: the light model (synthetic MNIST, 40 steps per epoch) and the
Colab walkthrough's CIFAR-10 CNN (synthetic CIFAR-10, 8,192 examples, 64 per
replica × 8 replicas = 16 steps per epoch).

Environment (all optional): ``TPUDASH_OVERHEAD_ROUNDS`` (default 8, quick 1),
``TPUDASH_OVERHEAD_SETUPS`` (``light,cnn``), ``TPUDASH_OVERHEAD_SIDES``
(``headless,tui``; ``headless-pipe`` adds the headless run into a pipe, without its live display), ``TPUDASH_OVERHEAD_HEAD`` (the tree measured as this
one, default this checkout), ``TPUDASH_OVERHEAD_BASE`` (a tree compared
with it, each side chosen). Run it alone with
``python -m tests.benchmarks --only overhead [--quick]``.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tests.benchmarks.harness import LoadMonitor, Result
from tests.benchmarks.overhead_sides import (  # re-exported: bench_pipeline and bench_callback use them
    FULL,
    QUICK,
    REPLICAS,
    SETUPS,
    TrainingSetup,
    cpu_input_options,
    plain_keras_throughputs,
    steady,
)
from tests.benchmarks.paired import Spread, paired_ratios, spread

__all__ = ["FULL", "QUICK", "TrainingSetup", "cpu_input_options", "plain_keras_throughputs", "run", "steady"]

TARGET_RATIO = 0.98
INTERVAL_FLOOR = 0.95
SIDES_SCRIPT = Path(__file__).with_name("overhead_sides.py")
REPO = Path(__file__).resolve().parents[2]
SIDE_TIMEOUT = 900.0


def side_process(side: str, setup: str, code: Path, quick: bool) -> dict:
    """One training in a process of its own; its figures, the machine's load meanwhile added."""
    argv = [sys.executable, str(SIDES_SCRIPT), "--side", side, "--setup", setup, "--code", str(code)]
    if quick:
        argv.append("--quick")
    load_before = os.getloadavg()[0]
    with LoadMonitor() as load:
        completed = subprocess.run(argv, cwd=code, capture_output=True, text=True, timeout=SIDE_TIMEOUT, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"{side} ({code}) exited {completed.returncode}: {completed.stderr[-3000:]}")
    figures = json.loads(completed.stdout.strip().splitlines()[-1])
    figures["load_average"] = load_before
    figures["external_cores"] = load.external_cores
    figures["process_seconds"] = load.wall_seconds
    return figures


def arms(sides: list[str], head: Path, base: Path | None) -> dict[str, tuple[str, Path]]:
    """Name → (side, tree) of everything a round runs: plain first in the table, not in time."""
    chosen = {"plain": ("plain", head)}
    if "headless" in sides:
        chosen["headless"] = ("headless", head)
        if base is not None:
            chosen["headless@base"] = ("headless", base)
    if "headless-pipe" in sides:
        chosen["headless-pipe"] = ("headless-pipe", head)
    if "tui" in sides:
        chosen["tui"] = ("tui", head)
        if base is not None:
            chosen["tui@base"] = ("tui", base)
    return chosen


def measure_rounds(setup: str, chosen: dict[str, tuple[str, Path]], rounds: int, quick: bool) -> dict[str, list]:
    """Every arm once per round, in a shuffled order (fixed seed); a failed run is None after the first round."""
    shuffler = random.Random(f"{setup}-overhead")
    runs: dict[str, list] = {name: [] for name in chosen}
    for round_number in range(rounds):
        order = list(chosen)
        shuffler.shuffle(order)
        for name in order:
            side, code = chosen[name]
            try:
                figures = side_process(side, setup, code, quick)
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as error:
                if round_number == 0:
                    raise
                print(f"[overhead] {setup} round {round_number + 1} {name} failed: {error}", file=sys.stderr)
                figures = None
            runs[name].append(figures)
            if figures is not None:
                print(
                    f"[overhead] {setup} round {round_number + 1}/{rounds} {name}: "
                    f"{figures['marginal_epoch_seconds']:.3f} s/epoch, "
                    f"{figures['steady_examples_per_second']:.0f} ex/s, "
                    f"{figures['cpu_seconds_per_step'] * 1000:.1f} ms CPU/step, "
                    f"load {figures['load_average']:.2f}",
                    file=sys.stderr,
                    flush=True,
                )
    return runs


def figure(runs: list, key: str) -> list[float]:
    return [run[key] if run is not None else float("nan") for run in runs]


def compare(runs: dict[str, list], name: str, against: str = "plain") -> dict[str, Spread]:
    """``name`` against ``against`` round by round: marginal epoch (speed), examples/s, CPU per step (cost)."""
    return {
        "marginal_epoch": spread(
            paired_ratios(figure(runs[against], "marginal_epoch_seconds"), figure(runs[name], "marginal_epoch_seconds"))
        ),
        "examples_per_second": spread(
            paired_ratios(
                figure(runs[name], "steady_examples_per_second"), figure(runs[against], "steady_examples_per_second")
            )
        ),
        "cpu_per_step": spread(
            paired_ratios(figure(runs[name], "cpu_seconds_per_step"), figure(runs[against], "cpu_seconds_per_step"))
        ),
    }


LABELS = {
    "headless": "tpudash run train (headless)",
    "headless@base": "tpudash run train (headless), base tree",
    "headless-pipe": "tpudash run train (headless) into a pipe, no live display",
    "tui": "TUI under Pilot, job in the engine process",
    "tui@base": "TUI under Pilot, job in the engine process, base tree",
}


def describe(setup_name: str, setup: TrainingSetup, rounds: int) -> str:
    model = "light model, synthetic MNIST" if setup.model == "light" else "CIFAR-10 CNN, synthetic CIFAR-10"
    return (
        f"{model}, {REPLICAS} replicas × {setup.batch_per_replica} per replica, "
        f"{setup.steps_per_epoch(REPLICAS)} steps × {setup.epochs - 1} marginal epochs after the first, {rounds} rounds"
    )


def results_for(setup_name: str, setup: TrainingSetup, runs: dict[str, list], rounds: int) -> list[Result]:
    valid = [run for name_runs in runs.values() for run in name_runs if run is not None]
    loads = [run["load_average"] for run in valid]
    external = [run["external_cores"] for run in valid]
    load_text = (
        f"load average {min(loads):.2f}–{max(loads):.2f} (median {statistics.median(loads):.2f}), other processes "
        f"kept {statistics.median(external):.2f} cores busy (median)"
    )
    plain_epoch = statistics.median(figure(runs["plain"], "marginal_epoch_seconds"))
    plain_cpu = statistics.median(figure(runs["plain"], "cpu_seconds_per_step"))
    results = []
    for name in runs:
        if name == "plain":
            continue
        spreads = compare(runs, name)
        epoch = spreads["marginal_epoch"]
        notes = (
            f"{describe(setup_name, setup, rounds)}; marginal epoch plain/side {epoch.text()}; "
            f"examples/s side/plain {spreads['examples_per_second'].text()}; CPU per step side/plain "
            f"{spreads['cpu_per_step'].text()} (plain {plain_cpu * 1000:.1f} ms CPU, "
            f"{statistics.median(figure(runs['plain'], 'wall_seconds_per_step')) * 1000:.1f} ms wall per step); "
            f"{load_text}"
        )
        samples: dict = {"runs": {"plain": runs["plain"], name: runs[name]}, "spreads": spreads}
        head_name = name.removesuffix("@base")
        if name.endswith("@base") and head_name in runs:
            against_base = compare(runs, head_name, against=name)
            notes += f"; this tree / base tree: marginal epoch {against_base['marginal_epoch'].text()}, CPU per step {against_base['cpu_per_step'].text()}"
            samples["head_vs_base"] = against_base
        # CPU per step read as a speed (plain / side): on a loaded machine wall time swings with the
        # neighbours, the CPU a step needs much less; above 0.98 tpudash costs at most 2 % more.
        cpu = spread(
            paired_ratios(figure(runs["plain"], "cpu_seconds_per_step"), figure(runs[name], "cpu_seconds_per_step"))
        )
        results.append(
            Result(
                benchmark="overhead",
                figure=f"{setup_name}: {LABELS[name]} CPU per step (process tree)",
                value=statistics.median(figure(runs[name], "cpu_seconds_per_step")) * 1000,
                unit="ms",
                baseline_name="plain Keras fit",
                baseline=plain_cpu * 1000,
                ratio=cpu.median,
                target=f"≥ {TARGET_RATIO}, interval > {INTERVAL_FLOOR}",
                met=cpu.median >= TARGET_RATIO and cpu.low > INTERVAL_FLOOR,
                samples={"plain_over_side": cpu.__dict__},
                notes=f"plain / side CPU per step {cpu.text()}",
            )
        )
        results.append(
            Result(
                benchmark="overhead",
                figure=f"{setup_name}: {LABELS[name]} marginal epoch",
                value=statistics.median(figure(runs[name], "marginal_epoch_seconds")),
                unit="s",
                baseline_name="plain Keras fit",
                baseline=plain_epoch,
                ratio=epoch.median,
                target=f"≥ {TARGET_RATIO}, interval > {INTERVAL_FLOOR}",
                met=epoch.median >= TARGET_RATIO and epoch.low > INTERVAL_FLOOR,
                samples=_jsonable(samples),
                notes=notes,
            )
        )
    return results


def _jsonable(value):
    if isinstance(value, Spread):
        return value.__dict__
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    return value


def run(quick: bool) -> list[Result]:
    rounds = int(os.environ.get("TPUDASH_OVERHEAD_ROUNDS", "1" if quick else "8"))
    setups = [name.strip() for name in os.environ.get("TPUDASH_OVERHEAD_SETUPS", "light,cnn").split(",") if name]
    sides = [name.strip() for name in os.environ.get("TPUDASH_OVERHEAD_SIDES", "headless,tui").split(",") if name]
    head = Path(os.environ.get("TPUDASH_OVERHEAD_HEAD", str(REPO))).resolve()
    base_text = os.environ.get("TPUDASH_OVERHEAD_BASE")
    base = Path(base_text).resolve() if base_text else None
    chosen = arms(sides, head, base)
    results = []
    for setup_name in setups:
        full, small = SETUPS[setup_name]
        started = time.perf_counter()
        runs = measure_rounds(setup_name, chosen, rounds, quick)
        print(f"[overhead] {setup_name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
        results += results_for(setup_name, small if quick else full, runs, rounds)
    return results
