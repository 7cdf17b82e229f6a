"""The tf.data pipeline rules, judged by walking the dataset's Python objects without running or serialising it."""

from __future__ import annotations

from typing import Any

import pytest

from tpudash.advice import pipeline
from tpudash.advice.pipeline import PIPELINE_RULES, advise_pipeline, rule_ids, stages

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


def _pitfalls(source: Any) -> Any:
    return source.map(_scale).map(_slow).repeat().shuffle(100).batch(100)


def _fixed(source: Any) -> Any:
    return (
        source.map(_scale, num_parallel_calls=tf.data.AUTOTUNE)
        .cache()
        .shuffle(100)
        .repeat()
        .batch(128)
        .prefetch(tf.data.AUTOTUNE)
    )


def test_pitfalls_pipeline_fires_each_rule(source: Any) -> None:
    advice = {a.rule: a for a in advise_pipeline(_pitfalls(source))}
    for rule in ("prefetch", "map-parallel", "shuffle-after-repeat", "py-function", "cache"):
        assert advice[rule].state == "fires", rule
        assert advice[rule].fix and advice[rule].detail["stage"]
    assert advice["map-parallel"].detail["stage"] == "MapDataset (stage 1)"
    assert advice["shuffle-after-repeat"].detail["stage"] == "ShuffleDataset (stage 4)"
    assert advice["py-function"].detail["stage"] == "MapDataset (stage 2)"
    assert advice["prefetch"].summary == "no prefetch at the end (last stage: BatchDataset (stage 5))"
    assert advice["interleave-parallel"].state == "quiet"
    # 600 images of 28x28 float32 plus 600 int64 labels, from the source tensors' shapes and dtypes.
    assert advice["cache"].detail["source_bytes"] == 600 * 28 * 28 * 4 + 600 * 8


def test_fixed_pipeline_fires_none(source: Any) -> None:
    assert _states(_fixed(source)) == dict.fromkeys(PIPELINE_RULES, "quiet")


def test_the_walk_never_serialises_the_dataset(source: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Serialising copies every constant (0.7 s for MNIST); with serialisation broken the verdicts are unchanged."""
    from tensorflow.python.ops import gen_dataset_ops

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the dataset was serialised")

    monkeypatch.setattr(tf.raw_ops, "DatasetToGraphV2", refuse)
    monkeypatch.setattr(gen_dataset_ops, "dataset_to_graph_v2", refuse)
    monkeypatch.setattr(tf.data.Dataset, "_as_serialized_graph", refuse)
    assert rule_ids(advise_pipeline(_pitfalls(source))) == [
        "prefetch",
        "map-parallel",
        "cache",
        "shuffle-after-repeat",
        "py-function",
    ]
    assert _states(_fixed(source)) == dict.fromkeys(PIPELINE_RULES, "quiet")


def test_interleave_without_parallelism_fires_and_parallel_is_quiet(source: Any) -> None:
    def inner(x: Any, y: Any) -> Any:
        return tf.data.Dataset.from_tensors((x, y))

    assert _states(source.interleave(inner, cycle_length=2))["interleave-parallel"] == "fires"
    parallel = source.interleave(inner, cycle_length=2, num_parallel_calls=tf.data.AUTOTUNE)
    assert _states(parallel)["interleave-parallel"] == "quiet"


def test_python_found_inside_called_functions_and_generators(source: Any) -> None:
    @tf.function
    def decode(x: Any) -> Any:
        return tf.numpy_function(lambda a: a, [x], tf.float32)

    nested = source.map(lambda x, y: (decode(x), y), num_parallel_calls=tf.data.AUTOTUNE).prefetch(1)
    assert _states(nested)["py-function"] == "fires"
    generated = tf.data.Dataset.from_generator(lambda: iter([1.0]), output_signature=tf.TensorSpec([], tf.float32))
    assert _states(generated.prefetch(1))["py-function"] == "fires"


def test_every_input_of_a_zip_is_walked(source: Any) -> None:
    zipped = tf.data.Dataset.zip((source, source.map(_scale))).prefetch(1)
    advice = {a.rule: a for a in advise_pipeline(zipped)}
    assert advice["map-parallel"].state == "fires"
    assert advice["map-parallel"].detail["stage"] == "MapDataset (stage 1)"
    # The one source both inputs read, counted once.
    assert advice["cache"].detail["source_bytes"] == 600 * 28 * 28 * 4 + 600 * 8


def test_cache_not_checked_for_file_sources_and_stages_in_order(tmp_path: Any) -> None:
    files = tf.data.TFRecordDataset([str(tmp_path / "none.tfrecord")]).prefetch(2)
    advice = {a.rule: a for a in advise_pipeline(files)}
    assert advice["cache"].state == "not checked"
    assert "TFRecordDataset" in advice["cache"].summary
    assert [s.kind for s in stages(files)] == ["TFRecordDatasetV2", "PrefetchDataset"]
    # Files opened by an interleave's function: the same verdict, from the function's ops.
    names = tf.data.Dataset.from_tensor_slices([str(tmp_path / "none.tfrecord")])
    opened = names.interleave(tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE).prefetch(1)
    assert "reads files" in {a.rule: a for a in advise_pipeline(opened)}["cache"].summary


def test_cache_quiet_above_the_bound_and_not_checked_for_unknown_sizes(
    source: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline, "CACHE_BOUND_BYTES", 1000)
    assert {a.rule: a for a in advise_pipeline(source)}["cache"].summary == "the source is too large to cache in memory"
    ragged = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1], [2, 3]]))
    assert {a.rule: a for a in advise_pipeline(ragged)}["cache"].state == "not checked"
    counted = {a.rule: a for a in advise_pipeline(tf.data.Dataset.range(10))}["cache"]
    assert counted.summary == "not checked: size of the source RangeDataset (stage 0) unknown without reading it"


def test_a_distributed_dataset_is_judged_as_the_users_pipeline(source: Any, runtime: Any) -> None:
    """What Keras's fit iterates under a strategy: the user's own pipeline inside it is walked."""
    pitfalls = _pitfalls(source)
    distributed = runtime.strategy.experimental_distribute_dataset(pitfalls)
    assert rule_ids(advise_pipeline(distributed)) == rule_ids(advise_pipeline(pitfalls))
    from_function = runtime.strategy.distribute_datasets_from_function(lambda context: _fixed(source))
    assert _states(from_function) == dict.fromkeys(PIPELINE_RULES, "quiet")


def test_what_cannot_be_walked_is_not_checked_and_never_raises(source: Any) -> None:
    variant = tf.data.experimental.to_variant(_pitfalls(source))
    opaque = tf.data.experimental.from_variant(variant, _pitfalls(source).element_spec).prefetch(1)
    advice = {a.rule: a for a in advise_pipeline(opaque)}
    assert advice["prefetch"].state == "quiet"  # the end is seen
    for rule in ("map-parallel", "cache", "shuffle-after-repeat", "interleave-parallel", "py-function"):
        assert advice[rule].summary == "not checked: VariantDataset (stage 0) cannot be walked: it holds a bare variant"
    iterator = {a.state for a in advise_pipeline(iter(source))}
    assert iterator == {"not checked"}


def test_no_dataset_is_not_checked() -> None:
    assert {a.state for a in advise_pipeline(None)} == {"not checked"}
    assert [a.rule for a in advise_pipeline([1, 2])] == list(PIPELINE_RULES)
