"""The tf.data pipeline rules, judged by walking the dataset graph without running it."""

from __future__ import annotations

from typing import Any

import pytest

from tpudash.advice.pipeline import PIPELINE_RULES, advise_pipeline, stages

tf = pytest.importorskip("tensorflow")


def _states(dataset: Any) -> dict[str, str]:
    return {a.rule: a.state for a in advise_pipeline(dataset)}


@pytest.fixture(scope="module", autouse=True)
def eight_devices_first(runtime: Any) -> None:
    """A dataset initialises TensorFlow's devices: the suite's 8 logical CPU devices must be set up before it is."""


@pytest.fixture(scope="module")
def source() -> Any:
    import numpy as np

    return tf.data.Dataset.from_tensor_slices((np.zeros((600, 28, 28), np.float32), np.zeros(600, np.int64)))


def _scale(x: Any, y: Any) -> Any:
    return x / 255.0, y


def _slow(x: Any, y: Any) -> Any:
    return tf.py_function(lambda a: a, [x], tf.float32), y


def test_pitfalls_pipeline_fires_each_rule(source: Any) -> None:
    pitfalls = source.map(_scale).map(_slow).repeat().shuffle(100).batch(100)
    advice = {a.rule: a for a in advise_pipeline(pitfalls)}
    for rule in ("prefetch", "map-parallel", "shuffle-after-repeat", "py-function", "cache"):
        assert advice[rule].state == "fires", rule
        assert advice[rule].fix and advice[rule].detail["stage"]
    assert advice["map-parallel"].detail["stage"] == "MapDataset (stage 1)"
    assert advice["shuffle-after-repeat"].detail["stage"].startswith("ShuffleDataset")
    assert advice["prefetch"].summary == "no prefetch at the end (last stage: BatchDatasetV2 (stage 5))"
    assert advice["interleave-parallel"].state == "quiet"
    # 600 images of 28x28 float32 plus 600 int64 labels, counted from the graph's constants.
    assert advice["cache"].detail["source_bytes"] == 600 * 28 * 28 * 4 + 600 * 8


def test_fixed_pipeline_fires_none(source: Any) -> None:
    fixed = (
        source.map(_scale, num_parallel_calls=tf.data.AUTOTUNE)
        .cache()
        .shuffle(100)
        .repeat()
        .batch(128)
        .prefetch(tf.data.AUTOTUNE)
    )
    assert _states(fixed) == dict.fromkeys(PIPELINE_RULES, "quiet")


def test_interleave_without_parallelism_fires_and_parallel_is_quiet(source: Any) -> None:
    def inner(x: Any, y: Any) -> Any:
        return tf.data.Dataset.from_tensors((x, y))

    assert _states(source.interleave(inner, cycle_length=2))["interleave-parallel"] == "fires"
    parallel = source.interleave(inner, cycle_length=2, num_parallel_calls=tf.data.AUTOTUNE)
    assert _states(parallel)["interleave-parallel"] == "quiet"


def test_cache_not_checked_for_file_sources_and_stages_in_order(tmp_path: Any) -> None:
    files = tf.data.TFRecordDataset([str(tmp_path / "none.tfrecord")]).prefetch(2)
    advice = {a.rule: a for a in advise_pipeline(files)}
    assert advice["cache"].state == "not checked"
    assert "TFRecordDataset" in advice["cache"].summary
    assert [s.op for s in stages(_graph(files))][-1] == "PrefetchDataset"


def test_no_dataset_is_not_checked() -> None:
    assert {a.state for a in advise_pipeline(None)} == {"not checked"}
    assert [a.rule for a in advise_pipeline([1, 2])] == list(PIPELINE_RULES)


def _graph(dataset: Any) -> Any:
    from tpudash.advice.pipeline import dataset_graph

    return dataset_graph(dataset)
