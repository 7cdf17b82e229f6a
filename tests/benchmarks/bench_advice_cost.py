"""Target: the advice (TPU checklist, recompile counters, MFU) costs a recorded ``fit`` ≤ 1 % — with ≤ 1.01 × without.

Side by side in one process, on ``bench_callback``'s set-up (the Colab TPU
walkthrough's CIFAR-10 CNN under the 8-replica CPU runtime, its synthetic
CIFAR-shaped data distributed as the train job distributes it), both sides
recording the fit with ``TpudashCallback``:

- **without**: ``TpudashCallback(advice=False)``;
- **with**: ``TpudashCallback()`` (advice on, the default): at the fit's
  start the peak lookup, the model and pipeline rules and the FLOPs count
  (on its own thread, at the lowest priority), at every epoch's end the
  trace counters and MFU, advice.json written each time; the count is
  awaited at the end. After each such fit advice.json must list every
  rule and the run's summary its MFU record.

The figure is the whole ``fit`` call's time (start and end included: that
is where the advice's work is), median over alternated trials (without,
with, without, …); the ratio is with ÷ without. Examples/s over the epochs
after the first is reported beside it.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

from tests.benchmarks.bench_callback import CallbackSetup, Trial, prepare, train
from tests.benchmarks.harness import Result

TARGET_RATIO = 1.01
# Fits of about half a minute on two cores: the advice's work is once per fit (the FLOPs count, ~0.2 s of
# CPU here) and once per epoch (~1 ms), so it is a share of the fit only against a length; a training
# worth advice runs minutes, this is a short one.
FULL = CallbackSetup(batch_per_replica=16, distinct_batches=8, steps_per_epoch=100, epochs=6, trials=4)


def check_advice(callback) -> dict:
    """advice.json lists every rule; run.json's summary holds the MFU record."""
    from tpudash.advice.report import read_report
    from tpudash.advice.rules import RULE_IDS

    run = callback.run
    report = read_report(run.files)
    if report is None or [advice.rule for advice in report.advice] != list(RULE_IDS):
        raise RuntimeError(f"{run.run_id}: advice.json missing or incomplete")
    meta = json.loads((Path(run.run_dir) / "run.json").read_text())
    mfu = (meta.get("summary") or {}).get("mfu")
    if not isinstance(mfu, dict) or mfu.get("flops_per_step") is None:
        raise RuntimeError(f"{run.run_id}: no FLOPs per step in the summary's MFU record: {mfu}")
    counted = getattr(callback._advisor, "_flops", None)  # the advisor's own FLOPs count and its time
    return {
        "count_seconds": getattr(counted, "seconds", None),
        "flops_per_step": mfu["flops_per_step"],
        "firing": [advice.rule for advice in report.firing()],
        "mfu": mfu.get("mfu"),
    }


def run(quick: bool) -> list[Result]:
    from tpudash.callbacks import TpudashCallback

    setup, strategy, global_batch, data, model, parameters = prepare(quick, FULL)
    runs_dir = Path(tempfile.mkdtemp(prefix="tpudash-bench-advice-"))
    model.fit(data, epochs=1, steps_per_epoch=setup.steps_per_epoch, verbose=0, shuffle=False)  # warm-up

    without: list[Trial] = []
    with_advice: list[Trial] = []
    checked: list[dict] = []
    for trial in range(setup.trials):
        plain = TpudashCallback(runs_dir=runs_dir, batch_size=global_batch, advice=False)
        without.append(train(model, data, setup, global_batch, [plain]))
        advised = TpudashCallback(runs_dir=runs_dir, batch_size=global_batch)
        with_advice.append(train(model, data, setup, global_batch, [advised]))
        checked.append(check_advice(advised))
        print(
            f"[advice_cost] trial {trial + 1}/{setup.trials}: fit without advice {without[-1].fit_seconds:.2f} s, "
            f"with {with_advice[-1].fit_seconds:.2f} s",
            file=sys.stderr,
            flush=True,
        )
    fit_without = statistics.median(t.fit_seconds for t in without)
    fit_with = statistics.median(t.fit_seconds for t in with_advice)
    rate_without = statistics.median(t.examples_per_second for t in without)
    rate_with = statistics.median(t.examples_per_second for t in with_advice)
    paired = [side.fit_seconds / base.fit_seconds for side, base in zip(with_advice, without, strict=True)]
    notes = (
        f"the CIFAR-10 CNN ({parameters:,} params), {int(strategy.num_replicas_in_sync)} replicas, global batch "
        f"{global_batch}, {setup.epochs} epochs × {setup.steps_per_epoch} steps per fit, {setup.trials} trials per "
        f"side alternated; median of paired ratios {statistics.median(paired):.3f} "
        f"(range {min(paired):.3f}–{max(paired):.3f}); the FLOPs count took "
        f"{statistics.median(c['count_seconds'] or 0 for c in checked):.2f} s (median, off the training thread)"
        f"; FLOPs per step {checked[-1]['flops_per_step']:,.0f}; "
        f"rules firing {', '.join(checked[-1]['firing']) or 'none'}"
    )
    return [
        Result(
            benchmark="advice_cost",
            figure="whole fit call with advice (TpudashCallback defaults)",
            value=fit_with,
            unit="s",
            baseline_name="TpudashCallback(advice=False)",
            baseline=fit_without,
            ratio=fit_with / fit_without,
            target=f"≤ {TARGET_RATIO} ×",
            met=fit_with / fit_without <= TARGET_RATIO,
            samples={"without": [t.fit_seconds for t in without], "with": [t.fit_seconds for t in with_advice]},
            notes=notes,
        ),
        Result(
            benchmark="advice_cost",
            figure="examples/s after each fit's first epoch, with advice",
            value=rate_with,
            unit="ex/s",
            baseline_name="without",
            baseline=rate_without,
            ratio=rate_with / rate_without,
            target="informative",
            samples={
                "without": [t.examples_per_second for t in without],
                "with": [t.examples_per_second for t in with_advice],
            },
            notes="the steps' own rate: the advice's per-epoch work is in it, its start and end are not",
        ),
    ]
