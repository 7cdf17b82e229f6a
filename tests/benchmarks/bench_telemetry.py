"""Target: sampling telemetry beside a user's ``fit`` costs it nothing — with the sampler ≥ 0.99 × without.

(The issue's goal; design.md asks ≥ 0.98.) tpudash samples the TPU (libtpu's
RuntimeMetricService over gRPC) and the host (psutil) while a run trains,
and appends every sample to the run's telemetry.jsonl. Normally the
dashboard samples from a process of its own; this measures the worst case,
the sampler in the training process itself, competing with it for the GIL
and the two cores, side by side in one process:

- **the model and the data**: exactly as ``bench_callback`` (whose helpers
  this imports): the Colab TPU walkthrough's CIFAR-10 CNN
  (``jobs.models.build_model("cifar-cnn")``)
  built under the 8-replica CPU runtime's ``strategy.scope()`` and compiled
  as ``jobs/train.py`` compiles it for ``fit``, traced once by a warm-up
  ``fit`` of one epoch; a synthetic CIFAR-shaped data set, one pipeline per
  replica (``distribute_datasets_from_function`` with the job's InputOptions:
  a plain data set handed to ``fit`` under the MirroredStrategy on a CPU
  stalls), the same sizes but for 40 steps an epoch instead of 50 (three
  sides to run instead of two): global batch 128, ``fit(epochs=4,
  steps_per_epoch=40)``, 5 trials per side (``--quick``: ``bench_callback.QUICK``).
- **the TPU metrics service**: a fake libtpu RuntimeMetricService
  (``tests.fake_tpu_metrics.FakeTpuMetrics``, 4 chips, on 127.0.0.1 with
  loopback credentials as libtpu's) serves from a gRPC thread pool in this
  process for the whole benchmark, before the warm-up until the end: idle
  during "off" trials, answering during "on" ones, so both sides run in the
  same process state (its threads, grpc loaded).
- **off**: ``model.fit(data, epochs=E, steps_per_epoch=S, verbose=0,
  callbacks=[timer])``.
- **on, 1 Hz** (the default) and **on, 10 Hz** (interval 0.1 s, the fastest
  allowed; to make the cost visible): the same ``fit`` while a
  ``tpudash.telemetry.sampling.SamplingLoop`` runs on a thread of this process,
  started just before and stopped just after: every sample reads the fake
  service through ``TelemetrySampler``'s gRPC client (duty cycle, HBM used,
  HBM total, HBM bandwidth: four calls) and psutil (CPU per core, memory,
  this process's resident memory as "trainer"), and a ``TelemetryRecorder``
  appends it to the telemetry.jsonl of a fresh run directory, as the
  dashboard records a live run. After each such ``fit`` every sample in
  that file must hold the fake's 4 chips and the host with nothing
  unavailable, and the ``fit`` call's seconds must hold at least (its
  seconds × rate × 0.95 − 1) of them (the loop's wake-ups run a little
  late beside training: ``RATE_ALLOWANCE``; the counts, the rate reached
  and the longest gap between two samples are in the notes). The loop is started before, and so runs
  through, the garbage collection ``bench_callback.train`` does before each
  ``fit``, which holds the GIL for a few tenths of a second.

Timing as ``bench_callback``: a timer callback notes every epoch's end; the
first epoch of each ``fit`` is left out; a trial's figure is examples over
the time of the other epochs. Trials go in rounds of off, 1 Hz, 10 Hz, the
order rotated from round to round (off, 1, 10; 1, 10, off; 10, off, 1; …);
each side's figure is the median over its trials and a ratio is on ÷ off of
those medians (the median of the paired ratios, each on-trial against the
off-trial of its round, is in the notes). The notes also give the sampling
thread's own CPU time (``time.thread_time`` after each sample is recorded;
it leaves out what the fake service's handlers spend, which on a TPU host
is libtpu's) and the whole process's CPU on and off.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from tests.benchmarks import bench_callback
from tests.benchmarks.bench_callback import CallbackSetup, Trial, train
from tests.benchmarks.harness import Result

TARGET_RATIO = 0.99
CHIPS = 4
# (side, sampling interval in seconds; None: no sampler)
SIDES = (("off", None), ("1 Hz", 1.0), ("10 Hz", 0.1))
# SamplingLoop waits out the interval from each sample's start, so every
# wake-up's lateness (mostly waiting for the GIL while the training thread
# holds it) adds up: at 10 Hz beside training it took 9.96 samples a second
# (233 in a 23.4 s fit). The check allows this much of the rate for that.
RATE_ALLOWANCE = 0.95
# bench_callback's sizes with 40 steps an epoch instead of 50: three sides
# instead of two, 15 fits of ~17 s (global batch 128, 4 epochs, 3 timed).
FULL = replace(bench_callback.FULL, steps_per_epoch=40)


@dataclass
class Sampled:
    """What the sampler did during one "on" trial."""

    seconds: float  # the loop's start to its stop (the fit call and the collection before it)
    fit_seconds: float  # the fit call alone
    samples: int = 0  # lines in the run's telemetry.jsonl
    fit_samples: int = 0  # of those, the ones stamped during the fit call
    longest_gap: float = 0.0  # seconds between two consecutive samples during the fit call, at most
    thread_cpu_seconds: float = 0.0  # the sampling thread's CPU, up to its last recorded sample
    process_cpu_seconds: float = 0.0  # the whole process's, from the loop's start to its stop
    write_errors: dict = field(default_factory=dict)


def sampled_fit(
    fake, model, data, setup: CallbackSetup, global_batch: int, interval: float, runs_dir: Path
) -> tuple[Trial, Sampled]:
    """One ``fit`` with a sampling loop at ``interval`` in this process, recording into a fresh run directory.

    The loop runs from before ``train``'s garbage collection to after the
    ``fit``; the samples are checked over the ``fit`` call alone (the
    collection holds the GIL for a few tenths of a second, and the sampler
    waits, as it would beside any Python program's).
    """
    from tpudash.runs.layout import TELEMETRY_FILE
    from tpudash.telemetry.recorder import TelemetryRecorder
    from tpudash.telemetry.sampling import SamplingLoop, TelemetrySampler

    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=runs_dir))
    recorder = TelemetryRecorder()
    thread_cpu = [0.0]

    def on_sample(stamp, sample):
        recorder.record(stamp, sample, [run_dir])
        thread_cpu[0] = time.thread_time()  # the sampling thread's, since it started

    pid = os.getpid()
    process_started = time.process_time()
    started = time.perf_counter()
    loop = SamplingLoop(
        TelemetrySampler(fake.address), interval=interval, on_sample=on_sample, processes=lambda: {"trainer": pid}
    ).start()
    try:
        trial = train(model, data, setup, global_batch, [])
        fit_ended = time.time()  # the samples' clock
    finally:
        loop.stop()
        recorder.close()
    sampled = Sampled(
        seconds=time.perf_counter() - started,
        fit_seconds=trial.fit_seconds,
        thread_cpu_seconds=thread_cpu[0],
        process_cpu_seconds=time.process_time() - process_started,
        write_errors={str(path): error for path, error in recorder.write_errors.items()},
    )
    check_recorded(run_dir / TELEMETRY_FILE, sampled, interval, fit_ended - trial.fit_seconds, fit_ended)
    return trial, sampled


def check_recorded(path: Path, sampled: Sampled, interval: float, fit_started: float, fit_ended: float) -> None:
    """Counts ``path``'s samples into ``sampled``; RuntimeError unless every sample holds the fake's chips and
    the host, and the fit call has at least (its seconds × the rate × RATE_ALLOWANCE − 1) of them."""
    if sampled.write_errors:
        raise RuntimeError(f"the recorder could not write: {sampled.write_errors}")
    if not path.is_file():
        raise RuntimeError(f"no {path.name} was recorded in {path.parent}")
    stamps = []
    with open(path) as lines:
        for line in lines:
            sample = json.loads(line)
            if sample.get("type") != "telemetry":
                raise RuntimeError(f"{path}: a line of type {sample.get('type')!r}")
            if sample.get("unavailable") or len(sample.get("chips") or []) != CHIPS or not sample.get("host"):
                raise RuntimeError(
                    f"{path}: sample {len(stamps) + 1} lacks the fake's {CHIPS} chips or the host: "
                    f"{sample.get('unavailable') or sample}"
                )
            stamps.append(float(sample["t"]))
    during = [stamp for stamp in stamps if fit_started <= stamp <= fit_ended]
    sampled.samples, sampled.fit_samples = len(stamps), len(during)
    sampled.longest_gap = max((later - earlier for earlier, later in zip(during, during[1:])), default=0.0)
    expected = RATE_ALLOWANCE * sampled.fit_seconds / interval - 1
    if len(during) < expected:
        raise RuntimeError(
            f"{path}: {len(during)} samples during a fit of {sampled.fit_seconds:.1f} s at "
            f"{1 / interval:g} Hz (at least {expected:.0f} expected, {RATE_ALLOWANCE:.0%} of the "
            f"rate less one; {len(stamps)} in all)"
        )


def run(quick: bool) -> list[Result]:
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # before grpc loads: its C core's info lines to stderr

    from tests.fake_tpu_metrics import GIB, FakeTpuMetrics

    setup, strategy, global_batch, data, model, parameters = bench_callback.prepare(quick)
    replicas = int(strategy.num_replicas_in_sync)
    runs_dir = Path(tempfile.mkdtemp(prefix="tpudash-bench-telemetry-"))
    fake = FakeTpuMetrics(chips=CHIPS).start()  # for both sides, through the warm-up as well
    fake.set(
        duty={chip: 90.0 - 10.0 * chip for chip in range(CHIPS)},
        used={chip: (chip + 1) * GIB for chip in range(CHIPS)},
        bandwidth={chip: 40.0 - 5.0 * chip for chip in range(CHIPS)},
    )
    trials: dict[str, list[Trial]] = {name: [] for name, _ in SIDES}
    sampled: dict[str, list[Sampled]] = {name: [] for name, interval in SIDES if interval is not None}
    process_cpu_off: list[float] = []  # the process's CPU over each off fit, as a fraction of its time
    try:
        # Warm-up: trace the train step and fill the cache, on neither side's clock.
        model.fit(data, epochs=1, steps_per_epoch=setup.steps_per_epoch, verbose=0, shuffle=False)
        for round_index in range(setup.trials):
            shift = round_index % len(SIDES)
            for name, interval in SIDES[shift:] + SIDES[:shift]:
                if interval is None:
                    started, cpu_started = time.perf_counter(), time.process_time()
                    trials[name].append(train(model, data, setup, global_batch, []))
                    process_cpu_off.append((time.process_time() - cpu_started) / (time.perf_counter() - started))
                else:
                    trial, record = sampled_fit(fake, model, data, setup, global_batch, interval, runs_dir)
                    trials[name].append(trial)
                    sampled[name].append(record)
            print(
                f"[telemetry] round {round_index + 1}/{setup.trials}: "
                + ", ".join(f"{name} {trials[name][-1].examples_per_second:,.0f} ex/s" for name, _ in SIDES)
                + " (samples during the fit: "
                + ", ".join(f"{sampled[name][-1].fit_samples} at {name}" for name in sampled)
                + ")",
                file=sys.stderr,
                flush=True,
            )
    finally:
        fake.stop()
        shutil.rmtree(runs_dir, ignore_errors=True)
    gc.collect()
    return results(trials, sampled, process_cpu_off, setup, parameters, replicas, global_batch)


def results(
    trials: dict[str, list[Trial]],
    sampled: dict[str, list[Sampled]],
    process_cpu_off: list[float],
    setup: CallbackSetup,
    parameters: int,
    replicas: int,
    global_batch: int,
) -> list[Result]:
    rates = {name: [trial.examples_per_second for trial in side] for name, side in trials.items()}
    off = statistics.median(rates["off"])
    described = (
        f"the Colab TPU walkthrough's CIFAR-10 CNN ({parameters:,} params), synthetic 32×32×3, "
        f"{replicas} replicas, "
        f"global batch {global_batch}, {setup.steps_per_epoch} steps × {setup.epochs - 1} epochs after "
        f"each fit's first, {setup.trials} trials per side in rotated rounds; sampler in the training "
        f"process (fake libtpu gRPC service, {CHIPS} chips; psutil; recorded); off trials "
        f"{min(rates['off']):,.0f}–{max(rates['off']):,.0f} ex/s"
    )
    rows = []
    for name, interval in SIDES:
        if interval is None:
            continue
        on = statistics.median(rates[name])
        ratio = on / off
        paired = [
            side.examples_per_second / base.examples_per_second for side, base in zip(trials[name], trials["off"])
        ]
        records = sampled[name]
        cpu_per_sample = [record.thread_cpu_seconds / record.samples * 1000 for record in records]
        process_cores = [record.process_cpu_seconds / record.seconds for record in records]
        default = interval == 1.0
        rows.append(
            Result(
                benchmark="telemetry",
                figure=(f"fit with telemetry sampled in-process at {name}{' (default)' if default else ''} examples/s"),
                value=on,
                unit="ex/s",
                baseline_name="the same fit without sampling",
                baseline=off,
                ratio=ratio,
                target=f"≥ {TARGET_RATIO} ×" if default else "informative (10 × the default rate)",
                met=ratio >= TARGET_RATIO if default else None,
                samples={
                    "off": rates["off"],
                    "on": rates[name],
                    "paired_ratios": paired,
                    "epoch_seconds": {
                        "off": [t.epoch_seconds for t in trials["off"]],
                        "on": [t.epoch_seconds for t in trials[name]],
                    },
                    "telemetry_samples": [record.samples for record in records],
                    "samples_during_fit": [record.fit_samples for record in records],
                    "fit_seconds": [round(record.fit_seconds, 2) for record in records],
                    "sampled_seconds": [round(record.seconds, 2) for record in records],
                    "longest_gap_seconds": [round(record.longest_gap, 3) for record in records],
                    "sampler_thread_cpu_seconds": [round(record.thread_cpu_seconds, 4) for record in records],
                    "process_cores_on": [round(cores, 3) for cores in process_cores],
                    "process_cores_off": [round(cores, 3) for cores in process_cpu_off],
                },
                notes=(
                    f"{described}; on trials {min(rates[name]):,.0f}–{max(rates[name]):,.0f} ex/s; median of paired "
                    f"ratios {statistics.median(paired):.3f} (range {min(paired):.3f}–{max(paired):.3f}); "
                    f"samples during each fit {min(r.fit_samples for r in records)}–"
                    f"{max(r.fit_samples for r in records)} in {min(r.fit_seconds for r in records):.1f}–"
                    f"{max(r.fit_seconds for r in records):.1f} s ({min(r.samples for r in records)}–"
                    f"{max(r.samples for r in records)} recorded in all; median rate "
                    f"{statistics.median(r.fit_samples / r.fit_seconds for r in records):.2f}/s), "
                    f"longest gap between two "
                    f"{max(r.longest_gap for r in records):.2f} s; "
                    f"sampling thread {statistics.median(cpu_per_sample):.2f} ms CPU per sample "
                    f"({statistics.median(r.thread_cpu_seconds / r.seconds for r in records):.4f} cores); "
                    f"process {statistics.median(process_cores):.2f} cores on, "
                    f"{statistics.median(process_cpu_off):.2f} off"
                ),
            )
        )
    return rows
