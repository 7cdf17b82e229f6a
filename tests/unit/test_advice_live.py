"""A run's advice as its writer keeps it: MFU against the matmul check's measured peak, from a fit and from the engine.

MFU is the step's FLOPs (counted by hand here for the model) × steps per
second ÷ the peak; the peak is the newest matmul check of the runs
directory. Both writers put the peak's source in run.json's runtime, MFU in
its summary, and every rule in advice.json.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from jobs.events import RunFinished
from tpudash.advice.report import read_report
from tpudash.advice.rules import RULE_IDS
from tpudash.runs.store import RunStore

MEASURED_GFLOPS = {
    "/job:localhost/replica:0/task:0/device:CPU:0": 40.0,
    "/job:localhost/replica:0/task:0/device:CPU:1": 50.0,
}


def record_matmul_check(store: RunStore) -> None:
    """A finished matmul check, as the job writes it: GFLOP/s per device that passed."""
    import socket

    from tpudash.runs.layout import new_run_id

    run_id = new_run_id("matmul")
    recorder = store.create(run_id, "matmul", {}, {"host": socket.gethostname(), "kind": "CPU"})
    recorder.record(RunFinished(status="done", summary={"gflops": MEASURED_GFLOPS, "failed_devices": []}))
    recorder.close()


def dense_train_flops_by_hand(batch: int, sizes: list[int]) -> int:
    """Forward (2·B·K·N per dense layer), the kernel's gradient (the same) and, past the first layer, the input's."""
    total = 0
    for index, (k, n) in enumerate(zip(sizes, sizes[1:], strict=False)):
        total += 2 * batch * k * n * (2 if index == 0 else 3)
    return total


def test_a_fit_measures_its_mfu_against_the_newest_matmul_check(runtime, xla_on_the_host, tmp_path):
    import keras
    import tensorflow as tf

    from tpudash.callbacks import TpudashCallback

    store = RunStore(tmp_path)
    store.prepare()
    record_matmul_check(store)
    sizes, batch = [32, 256, 128], 64
    x = np.random.default_rng(3).normal(size=(batch * 4, sizes[0])).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, x[:, :1] > 0)).batch(batch, drop_remainder=True).repeat()
    model = keras.Sequential([keras.Input((sizes[0],)), keras.layers.Dense(sizes[1]), keras.layers.Dense(sizes[2])])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = TpudashCallback(name="mfu", runs_dir=tmp_path)
    model.fit(dataset, epochs=3, steps_per_epoch=4, verbose=0, callbacks=[callback])

    meta = json.loads((callback.run.run_dir / "run.json").read_text())
    peak = meta["runtime"]["mfu_peak"]
    assert peak["flops_per_second"] == 50e9  # logical CPU devices share the cores: the fastest one
    assert "measured by the matmul check" in peak["source"]
    mfu = meta["summary"]["mfu"]
    assert mfu["flops_per_step"] == dense_train_flops_by_hand(batch, sizes), mfu["flops_source"]
    assert mfu["mfu"] == pytest.approx(mfu["flops_per_step"] * mfu["steps_per_second"] / 50e9)
    assert 0 < mfu["mfu"] < 1 and mfu["why"] == ""
    report = read_report(callback.run.files)
    assert report is not None and [a.rule for a in report.advice] == list(RULE_IDS)
    assert report.mfu is not None and report.mfu.mfu == pytest.approx(mfu["mfu"])


def test_the_engines_train_job_keeps_advice_and_mfu(run_job, store):
    record_matmul_check(store)
    result = run_job("train", source="synthetic", batch_per_replica=4, limit_train=128, limit_test=32, epochs=2)
    assert result.finished.status == "done", result.finished.error
    run_dir = result.run.run_dir
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["runtime"]["mfu_peak"]["flops_per_second"] == 50e9
    summary_mfu = meta["summary"]["mfu"]
    assert summary_mfu["flops_per_step"] and summary_mfu["mfu"] is not None, summary_mfu
    report = read_report(store.files(result.run.run_id))
    assert report is not None
    small = report.rule("small-batch")
    assert small.state == "fires" and small.detail["batch_per_core"] == 4
    # The job's own pipeline (jobs.datasets) prefetches and maps in parallel.
    assert report.rule("prefetch").state == "quiet" and report.rule("map-parallel").state == "quiet"


def test_a_second_fit_with_another_batch_size_recompiles_and_its_run_says_so(runtime, tmp_path):
    import keras

    from jobs.events import Log
    from tpudash.callbacks import TpudashCallback

    x = np.random.default_rng(5).normal(size=(96, 4)).astype("float32")
    y = x[:, :2]
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    callback = TpudashCallback(name="shapes", runs_dir=tmp_path)
    model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[callback])
    first = read_report(callback.run.files)
    assert first is not None and first.rule("recompiles").state == "quiet" and not first.marks

    model.fit(x, y, batch_size=48, epochs=2, verbose=0, callbacks=[callback])  # the step traced again
    second = read_report(callback.run.files)
    assert second is not None and second.run_id != first.run_id  # a second fit is a run of its own
    fired = second.rule("recompiles")
    assert fired.state == "fires" and "compiled 2 times" in fired.summary and "drop_remainder" in fired.fix
    assert second.marks and second.marks[0].step == 2  # the first epoch's end: 96 / 48 steps
    assert "None" in second.marks[0].cause  # TensorFlow relaxed the batch dimension when it traced again
    data = RunStore(tmp_path).load(second.run_id)
    logs = [event.text for _, event in data.events if isinstance(event, Log)]
    assert any(text.startswith("recompiled train.") for text in logs), logs
