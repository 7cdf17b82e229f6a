"""How a run's writers start its advice: a Keras ``fit`` (``TpudashCallback``) and a hand-written loop (``run.advise``).

Kept out of the callback and ``tpudash.recording`` so that they stay about
recording: this module turns what a ``fit`` holds (the model, the data
adapter, the batch, the train function), or what a loop says (its FLOPs per
step, batch and dataset), into a started ``RunAdvisor``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpudash.advice.flops import FlopsCount
from tpudash.advice.live import RunAdvisor, run_peak
from tpudash.advice.mfu import PeakFlops
from tpudash.fitinfo import adapter_dataset, dataset_batch_size


def fit_peak(runs_root: Path | str, runtime: Mapping[str, Any]) -> PeakFlops:
    """The peak a fit's MFU is measured against (``live.run_peak``) in the runs directory it records into."""
    from tpudash.runs.store import RunStore

    try:
        store = RunStore(runs_root)
    except Exception as error:  # noqa: BLE001 - the run's own creation says what is wrong with the directory
        return PeakFlops(None, f"the runs directory could not be read: {type(error).__name__}: {error}")
    return run_peak(store, runtime)


def start_fit_advice(
    run: Any, runtime: Mapping[str, Any], peak: PeakFlops, model: Any, adapter: Any, batch_size: int | None
) -> RunAdvisor:
    """A started advisor for ``run`` (a ``RecordedRun``): static rules judged, FLOPs counting, advice.json written."""
    advisor = RunAdvisor(run.files, run.run_id, runtime, peak, log=lambda text, level: run.log(text, level))
    dataset, why = adapter_dataset(adapter)
    if batch_size is None and dataset is not None:
        batch_size = dataset_batch_size(dataset)  # Keras does not say for a dataset; its batch stage does
    advisor.start(model=model, dataset=dataset, no_dataset_why=why, global_batch=batch_size)
    return advisor


def start_loop_advice(
    run: Any, store: Any, flops_per_step: float | None, global_batch: int | None, dataset: Any
) -> RunAdvisor:
    """A started advisor for a ``tpudash.record`` run (``RecordedRun.advise``; its arguments checked there)."""
    advisor = RunAdvisor(
        run.files, run.run_id, run.runtime, run_peak(store, run.runtime), log=lambda text, level: run.log(text, level)
    )
    advisor.set_flops(
        FlopsCount(float(flops_per_step), "given by the training loop (run.advise)")
        if flops_per_step is not None
        else FlopsCount(None, "not given (run.advise(flops_per_step=…))")
    )
    advisor.start(dataset=dataset, global_batch=global_batch, count_flops=False)
    return advisor
