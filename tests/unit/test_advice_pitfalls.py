"""The TPU performance checklist on a user's own fit: a script with the article's pitfalls, and its fixed version.

Both train with ``TpudashCallback`` on the suite's 8 logical CPU devices; the
run's advice.json (what the Advice tab and ``tpudash advise`` read) must name
each pitfall the script has, with the line to change, and none in the fixed one.
"""

from __future__ import annotations

import json

import numpy as np

from tests.unit.test_cli import run_cli
from tpudash.advice.report import read_report

PITFALLS = {"padding", "prefetch", "map-parallel", "shuffle-after-repeat", "small-batch"}


def _data(features: int, examples: int) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(7)
    x = generator.normal(size=(examples, features)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32")  # learnable: the sign of the first feature


def _scale(x, y):
    return x * 0.5, y


def pitfalls_fit(strategy, runs_dir):
    """Batch 100, Dense(1000), a serial map, no prefetch, shuffle after repeat: the article's list.

    On one device (``strategy`` is the default one), as a first script is: a batch of 100 does not split evenly
    over 8 replicas.
    """
    import keras
    import tensorflow as tf

    from tpudash.callbacks import TpudashCallback

    x, y = _data(20, 400)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).map(_scale).batch(100).repeat().shuffle(8)
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(1000, activation="relu"), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = TpudashCallback(name="pitfalls", runs_dir=runs_dir)
    model.fit(dataset, epochs=2, steps_per_epoch=2, verbose=0, callbacks=[callback])
    return callback.run


def fixed_fit(strategy, runs_dir):
    """The same training with each pitfall fixed: sizes in 128s, a batch of 128 per core, the pipeline in order."""
    import keras
    import tensorflow as tf

    from tpudash.callbacks import TpudashCallback

    batch = 128 * strategy.num_replicas_in_sync
    x, y = _data(128, batch * 2)
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .map(_scale, num_parallel_calls=tf.data.AUTOTUNE)
        .cache()
        .shuffle(256)
        .repeat()
        .batch(batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    with strategy.scope():
        model = keras.Sequential(
            # 128 logits for 2 classes: the classifier padded to the matrix unit's width by hand
            [keras.Input((128,)), keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(128)]
        )
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = TpudashCallback(name="fixed", runs_dir=runs_dir)
    model.fit(dataset, epochs=2, steps_per_epoch=2, verbose=0, callbacks=[callback])
    return callback.run


def test_the_pitfalls_script_trips_each_rule_it_has_with_the_line_to_change(runtime, tmp_path):
    run = pitfalls_fit(None, tmp_path)
    report = read_report(run.files)
    assert report is not None and report.run_id == run.run_id
    firing = {advice.rule: advice for advice in report.firing()}
    assert PITFALLS <= set(firing), {a.rule: a.summary for a in report.advice}
    assert "would waste" in firing["padding"].summary and "on a TPU" in firing["padding"].summary  # a CPU run
    assert firing["padding"].detail["batch_per_core"] == 100
    assert "prefetch(tf.data.AUTOTUNE)" in firing["prefetch"].fix
    assert "num_parallel_calls" in firing["map-parallel"].fix
    assert "would underfeed a TPU core" in firing["small-batch"].summary
    assert report.hint() is not None  # the header's line
    # Keras traces its step function twice for one tf.data signature: one program, no recompile.
    assert report.rule("recompiles").state == "quiet" and not report.marks

    advised = run_cli("advise", run.run_id, "--json", "--runs-dir", str(tmp_path))
    assert advised.returncode == 0, advised.stderr
    printed = json.loads(advised.stdout)
    assert printed["run"] == run.run_id
    assert PITFALLS <= {item["rule"] for item in printed["advice"] if item["state"] == "fires"}


def test_the_fixed_script_trips_none(runtime, tmp_path):
    run = fixed_fit(runtime.strategy, tmp_path)
    report = read_report(run.files)
    assert report is not None
    assert not report.firing(), [(a.rule, a.summary) for a in report.firing()]
    quiet = {advice.rule for advice in report.advice if advice.state == "quiet"}
    assert PITFALLS | {"cache", "interleave-parallel", "py-function", "mixed-precision", "recompiles"} <= quiet
    assert report.hint() is None

    advised = run_cli("advise", run.run_id, "--json", "--runs-dir", str(tmp_path))
    assert advised.returncode == 0, advised.stderr
    assert not [item["rule"] for item in json.loads(advised.stdout)["advice"] if item["state"] == "fires"]


def test_the_run_records_its_mfu_with_where_the_peak_comes_from(runtime, tmp_path):
    run = fixed_fit(runtime.strategy, tmp_path)
    meta = json.loads((run.run_dir / "run.json").read_text())
    # No matmul check in this runs directory: MFU is unknown, and run.json says why.
    assert meta["runtime"]["mfu_peak"]["flops_per_second"] is None
    assert "tpudash run matmul" in meta["runtime"]["mfu_peak"]["source"]
    assert meta["summary"]["mfu"]["mfu"] is None and "peak unknown" in meta["summary"]["mfu"]["why"]
