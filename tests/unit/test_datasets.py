"""jobs.datasets: tfds loading (mocked, and offline), the synthetic set, the pipelines.

No test touches the network: tfds is mocked with ``tfds.testing.mock_data``,
"no network" is a probe that answers False, and the probe itself is tested
against local sockets only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from jobs import datasets
from jobs.datasets import DATASETS, DatasetUnavailable, load_splits, network_reachable
from tests.conftest import REPO_ROOT
from tests.unit.test_cli import USER_UNSET


@pytest.fixture(autouse=True)
def shared_runtime(runtime):
    """TensorFlow's devices are configured once per process: set up the shared
    8-device runtime before these tests touch TensorFlow, or every later test
    in the session would see one device."""
    return runtime


def as_arrays(dataset):
    images, labels = zip(*((image.numpy(), label.numpy()) for image, label in dataset))
    return np.stack(images), np.array(labels)


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_synthetic_split_has_the_real_shapes_dtypes_and_classes(name):
    shape = DATASETS[name]
    splits = load_splits(name, "synthetic", limit_train=200, limit_test=50, seed=3)
    images, labels = as_arrays(splits.train)
    assert images.shape == (200, *shape.image_shape)
    assert images.dtype == np.uint8 and labels.dtype == np.int64
    assert set(np.unique(labels)) == set(range(shape.num_classes))
    assert (splits.train_examples, splits.test_examples) == (200, 50)
    assert "synthetic" in splits.label and shape.title in splits.label


def test_synthetic_data_is_seeded_and_train_differs_from_test():
    first = as_arrays(load_splits("mnist", "synthetic", limit_train=64, limit_test=64, seed=7).train)
    again = as_arrays(load_splits("mnist", "synthetic", limit_train=64, limit_test=64, seed=7).train)
    other_seed = as_arrays(load_splits("mnist", "synthetic", limit_train=64, limit_test=64, seed=8).train)
    test_split = as_arrays(load_splits("mnist", "synthetic", limit_train=64, limit_test=64, seed=7).test)
    assert np.array_equal(first[0], again[0]) and np.array_equal(first[1], again[1])
    assert not np.array_equal(first[0], other_seed[0])
    assert not np.array_equal(first[0], test_split[0])


def test_synthetic_classes_are_learnable_by_a_nearest_mean_classifier():
    # The class of an example must be recoverable from its pixels, else no
    # model could learn it: class means from 500 training images classify
    # held-out test images far above the 10% of guessing.
    splits = load_splits("cifar10", "synthetic", limit_train=500, limit_test=300, seed=1)
    train_images, train_labels = as_arrays(splits.train)
    test_images, test_labels = as_arrays(splits.test)
    flat_train = train_images.reshape(len(train_images), -1).astype(np.float32)
    flat_test = test_images.reshape(len(test_images), -1).astype(np.float32)
    means = np.stack([flat_train[train_labels == label].mean(axis=0) for label in range(10)])
    distances = ((flat_test[:, None, :] - means[None]) ** 2).sum(axis=2)
    accuracy = float((distances.argmin(axis=1) == test_labels).mean())
    assert accuracy > 0.6


def test_tfds_source_loads_through_tfds_with_limits(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=40):
        splits = load_splits("cifar10", "tfds", data_dir=tmp_path, limit_train=24, limit_test=16)
        images, labels = as_arrays(splits.train)
    assert images.shape == (24, 32, 32, 3) and images.dtype == np.uint8
    assert (splits.train_examples, splits.test_examples) == (24, 16)
    assert splits.label == "CIFAR-10 from tfds"
    assert splits.data_dir == str(tmp_path)


def test_offline_without_a_local_copy_fails_at_once_and_says_what_to_do(tmp_path, monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    load_calls = []
    real_load = tfds.load

    def recording_load(*args, **kwargs):
        load_calls.append(kwargs.get("download", True))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(tfds, "load", recording_load)
    probed = []

    def no_network(hosts):
        probed.extend(hosts)
        return False

    empty_dir = tmp_path / "no-data-here"
    with pytest.raises(DatasetUnavailable) as raised:
        load_splits("mnist", "tfds", data_dir=empty_dir, reachable=no_network)
    message = str(raised.value)
    assert str(empty_dir) in message
    assert "--data-dir" in message and "source=synthetic" in message
    # Only the no-download look-up ran: the download that retries for minutes never started.
    assert load_calls == [False]
    assert probed == list(DATASETS["mnist"].download_hosts)


def test_network_probe_is_false_for_a_refused_connection():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    # Nothing listens on the port any more: the connection is refused.
    assert network_reachable([f"127.0.0.1:{port}"], timeout=2.0) is False


def test_network_probe_is_true_when_a_host_accepts():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        assert network_reachable(["127.0.0.1:1", f"127.0.0.1:{port}"], timeout=2.0) is True


def test_network_probe_gives_up_on_a_host_that_hangs(monkeypatch):
    # A resolver that hangs, then would "connect": a probe bounded by its
    # timeout answers False without waiting for it.
    release = threading.Event()

    class Connection:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def hanging_connect(address, timeout=None):
        release.wait(30)
        return Connection()

    monkeypatch.setattr(datasets.socket, "create_connection", hanging_connect)
    try:
        assert network_reachable(["hangs.example"], timeout=0.2) is False
    finally:
        release.set()


def test_training_pipeline_gives_full_scaled_batches_endlessly():
    import tensorflow as tf

    splits = load_splits("mnist", "synthetic", limit_train=100, limit_test=10, seed=0)
    batches = list(datasets.training_pipeline(splits.train, 32, seed=0).take(7))
    assert all(images.shape == (32, 28, 28, 1) for images, _ in batches)  # 7 × 32 > 100: it repeats
    assert all(images.dtype == tf.float32 for images, _ in batches)
    values = np.concatenate([images.numpy().ravel() for images, _ in batches])
    assert values.min() >= 0.0 and values.max() <= 1.0 and values.max() > 0.5


def test_training_pipeline_shuffles_every_pass():
    splits = load_splits("mnist", "synthetic", limit_train=64, limit_test=8, seed=0)
    passes = [labels.numpy() for _, labels in datasets.training_pipeline(splits.train, 64, seed=0).take(2)]
    assert sorted(passes[0]) == sorted(passes[1])  # each pass is the whole split once…
    assert not np.array_equal(passes[0], passes[1])  # …in a new order


def test_per_replica_evaluation_pipelines_together_cover_every_test_example_once():
    import tensorflow as tf

    splits = load_splits("mnist", "synthetic", limit_train=10, limit_test=70, seed=0)
    _, expected = as_arrays(splits.test)
    seen = []
    for pipeline_id in range(3):
        context = tf.distribute.InputContext(
            num_input_pipelines=3, input_pipeline_id=pipeline_id, num_replicas_in_sync=3
        )
        batches = list(datasets.evaluation_pipeline(splits.test, 8, input_context=context))
        assert all(images.shape[0] <= 8 for images, _ in batches)
        seen.extend(label for _, labels in batches for label in labels.numpy())
    assert sorted(seen) == sorted(expected) and len(seen) == 70


def test_evaluation_steps_count_partial_batches_unless_dropped():
    assert datasets.evaluation_steps(70, 32) == 3
    assert datasets.evaluation_steps(70, 32, drop_remainder=True) == 2


def test_unknown_dataset_or_source_is_refused_with_the_allowed_names():
    with pytest.raises(ValueError, match="dataset.*mnist"):
        load_splits("imagenet", "synthetic")
    with pytest.raises(ValueError, match="source.*synthetic"):
        load_splits("mnist", "disk")


def test_both_splits_are_made_once_in_chunks_reporting_progress():
    reports = []
    splits = load_splits(
        "mnist",
        "synthetic",
        limit_train=9000,
        limit_test=100,
        seed=0,
        progress=lambda done, total: reports.append((done, total)),
    )
    # 9,000 training examples in chunks of 4,096, then the 100 test examples.
    assert reports == [(4096, 9100), (8192, 9100), (9000, 9100), (9100, 9100)]
    assert (splits.train_examples, splits.test_examples) == (9000, 100)


def test_a_smaller_synthetic_set_is_the_start_of_a_larger_one():
    # A limit cuts the same data short instead of drawing other data, as it does with tfds.
    small = as_arrays(load_splits("mnist", "synthetic", limit_train=10, limit_test=10, seed=4).train)
    large = as_arrays(load_splits("mnist", "synthetic", limit_train=5000, limit_test=10, seed=4).train)
    assert np.array_equal(small[0], large[0][:10]) and np.array_equal(small[1], large[1][:10])


# `tpudash run` as a user types it, in a fresh process whose network probe finds no host.
OFFLINE_CLI = (
    "import sys, jobs.datasets as datasets; datasets.network_reachable = lambda hosts, **kw: False; "
    "from tpudash.cli.main import main; sys.exit(main(sys.argv[1:]))"
)


def test_tpudash_run_offline_says_what_to_do_without_tfds_stray_warning(tmp_path):
    # tfds warns about a "Variant folder … has no dataset_info.json" that does
    # not exist, right before our own message says what to do.
    pytest.importorskip("tensorflow_datasets")
    empty = tmp_path / "data"
    empty.mkdir()
    environment = {key: value for key, value in os.environ.items() if key not in USER_UNSET}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            OFFLINE_CLI,
            "run",
            "train",
            "--set",
            "source=tfds",
            "--set",
            "dataset=mnist",
            "--data-dir",
            str(empty),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=environment,
        timeout=120,
    )
    assert result.returncode == 1
    output = " ".join((result.stdout + result.stderr).split())
    assert "DatasetUnavailable" in output and "--data-dir" in output and "source=synthetic" in output
    assert "dataset_info.json" not in result.stderr + result.stdout
