"""A hand-written JAX loop's advice through ``tpudash.record``: MFU from its FLOPs per step and its steps/s.

The loop says its step's FLOPs once (``step_flops_jax``, checked against a
count by hand in test_advice_flops_jax) and its epochs; MFU is measured at
every epoch against the newest matmul check of the runs directory, and kept
in advice.json, the ``mfu`` metric and run.json's summary.
"""

from __future__ import annotations

import json
import socket

import pytest

from jobs.events import RunFinished
from tests.jax.test_advice_flops_jax import BATCH, matmul_flops_by_hand, mlp_step
from tpudash.advice.flops import step_flops_jax
from tpudash.advice.report import read_report
from tpudash.runs.layout import new_run_id
from tpudash.runs.store import RunStore

PEAK_GFLOPS = 80.0


def record_matmul_check(store: RunStore) -> None:
    recorder = store.create(new_run_id("matmul"), "matmul", {}, {"host": socket.gethostname(), "kind": "CPU"})
    recorder.record(RunFinished(status="done", summary={"gflops": {"TFRT_CPU_0": PEAK_GFLOPS}, "failed_devices": []}))
    recorder.close()


def test_a_jax_loop_keeps_its_mfu_against_the_measured_peak(tmp_path):
    import jax

    import tpudash

    store = RunStore(tmp_path)
    store.prepare()
    record_matmul_check(store)
    step, params, x, y = mlp_step()
    count = step_flops_jax(step, params, x, y)
    assert matmul_flops_by_hand(BATCH) <= count.flops <= 1.02 * matmul_flops_by_hand(BATCH)
    with tpudash.record("jax-mlp", {"batch": BATCH}, runs_dir=tmp_path) as run:
        report = run.advise(flops_per_step=count.flops, global_batch=BATCH)
        assert report.rule("small-batch").state == "quiet"  # 128 on one device
        global_step = 0
        for epoch in range(1, 4):
            for _ in range(20):
                global_step += 1
                with run.step(global_step):
                    params = step(params, x, y)
            jax.block_until_ready(params)
            run.progress(epoch, 3, "epoch")
    meta = json.loads((run.run_dir / "run.json").read_text())
    mfu = meta["summary"]["mfu"]
    assert mfu["flops_per_step"] == count.flops and mfu["peak_flops_per_second"] == PEAK_GFLOPS * 1e9
    assert mfu["mfu"] == pytest.approx(count.flops * mfu["steps_per_second"] / (PEAK_GFLOPS * 1e9))
    assert 0 < mfu["mfu"] and "matmul check" in mfu["peak_source"]
    assert meta["final_metrics"]["mfu"] > 0  # the per-epoch metric, as `tpudash runs` shows it
    stored = read_report(run.files)
    assert stored is not None and stored.mfu is not None and stored.mfu.mfu == pytest.approx(mfu["mfu"])


def test_advise_refuses_what_it_cannot_use_naming_the_field(tmp_path):
    import tpudash
    from tpudash.recording import RecordingError

    with tpudash.record("bad", runs_dir=tmp_path) as run:
        with pytest.raises(RecordingError, match="flops_per_step"):
            run.advise(flops_per_step=-1)
        with pytest.raises(RecordingError, match="global_batch"):
            run.advise(global_batch="big")
