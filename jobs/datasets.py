"""Image datasets for the training jobs: MNIST, Fashion-MNIST and CIFAR-10.

Two sources with the same shapes and classes:

- ``tfds``: ``tfds.load(name, split, data_dir, as_supervised=True,
  try_gcs=<on a TPU>)``, as the seeds do. With no local copy tfds would
  download; offline it retries for minutes. So the local copy is looked for
  first (``download=False`` answers at once), and only if it is missing are
  the download hosts probed (a few seconds at most): unreachable hosts end the
  run at once with a message naming the data dir, ``--data-dir`` and
  ``source=synthetic``.
- ``synthetic``: a learnable stand-in generated lazily inside tf.data: each
  class has a seeded pattern; an example is its class pattern at a random
  contrast plus Gaussian noise, as uint8 like the real images. Every output
  says it is synthetic.

The input pipelines follow seed 001: generation/decoding mapped with AUTOTUNE,
``cache`` of the small uint8 data, ``shuffle`` before ``repeat``, ``batch``
with the global batch (per-replica batch × replicas, seed 000), the scaling to
[0, 1] mapped on whole batches (a vectorised map, also seed 001, which keeps
the cache four times smaller than caching float32), ``prefetch`` last.
tf.data's background tuning thread is switched off (without_tuning_thread).
Nothing here imports tensorflow at module level.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

SOURCES = ("tfds", "synthetic")
NETWORK_PROBE_SECONDS = 3.0
SHUFFLE_BUFFER = 10_000


@dataclass(frozen=True)
class DatasetShape:
    """What a dataset looks like, whichever source provides it."""

    name: str
    title: str
    image_shape: tuple[int, int, int]
    num_classes: int
    train_examples: int
    test_examples: int
    download_hosts: tuple[str, ...]


DATASETS: dict[str, DatasetShape] = {
    "mnist": DatasetShape("mnist", "MNIST", (28, 28, 1), 10, 60_000, 10_000, ("storage.googleapis.com",)),
    "fashion_mnist": DatasetShape(
        "fashion_mnist", "Fashion-MNIST", (28, 28, 1), 10, 60_000, 10_000,
        ("fashion-mnist.s3-website.eu-central-1.amazonaws.com",),
    ),
    "cifar10": DatasetShape("cifar10", "CIFAR-10", (32, 32, 3), 10, 50_000, 10_000, ("www.cs.toronto.edu",)),
}
DATASET_NAMES = tuple(DATASETS)


class DatasetUnavailable(RuntimeError):
    """The requested data cannot be had here; the message says what to do."""


@dataclass
class Splits:
    """The train and test splits, unbatched ``(uint8 image, int64 label)``."""

    shape: DatasetShape
    source: str
    train: Any
    test: Any
    train_examples: int
    test_examples: int
    data_dir: str | None = None

    @property
    def label(self) -> str:
        """How every output names the data: the synthetic set never passes for the real one."""
        if self.source == "synthetic":
            return f"synthetic {self.shape.title}-shaped data (not the real {self.shape.title})"
        return f"{self.shape.title} from tfds"


def effective_data_dir(data_dir: Path | str | None) -> str:
    """The directory tfds reads: the configured one, else TFDS_DATA_DIR, else tfds's default."""
    if data_dir:
        return str(data_dir)
    if os.environ.get("TFDS_DATA_DIR"):
        return os.environ["TFDS_DATA_DIR"]
    return str(Path.home() / "tensorflow_datasets")


def network_reachable(hosts: Iterable[str], timeout: float = NETWORK_PROBE_SECONDS, port: int = 443) -> bool:
    """Whether a TCP connection to any of ``hosts`` opens within ``timeout`` seconds.

    Name resolution can hang far longer than a connect timeout when there is
    no network, so every probe runs in a daemon thread and the whole check is
    bounded by ``timeout``. A host may carry its own port ("host:port").
    """
    reached = threading.Event()

    def probe(target: str) -> None:
        host, _, port_text = target.partition(":")
        try:
            with socket.create_connection((host, int(port_text) if port_text else port), timeout=timeout):
                reached.set()
        except OSError:
            pass

    threads = [
        threading.Thread(target=probe, args=(target,), name=f"tpudash-probe-{target}", daemon=True)
        for target in hosts
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if reached.is_set():
            break
    return reached.is_set()


def unavailable_message(shape: DatasetShape, data_dir: str) -> str:
    return (
        f"{shape.title} is not in the tfds data dir {data_dir} and its download host "
        f"({', '.join(shape.download_hosts)}) cannot be reached, so tfds would retry for minutes. "
        f"Point --data-dir (or TPUDASH_DATA_DIR) at a directory holding a prepared copy "
        f"(`tfds build {shape.name} --data_dir DIR` on a machine with network), "
        f"or run with --set source=synthetic for a synthetic {shape.title}-shaped set."
    )


def load_splits(
    name: str,
    source: str,
    *,
    data_dir: Path | str | None = None,
    try_gcs: bool = False,
    limit_train: int = 0,
    limit_test: int = 0,
    seed: int = 0,
    log: Callable[[str, str], None] | None = None,
    reachable: Callable[[Iterable[str]], bool] | None = None,
) -> Splits:
    """Both splits of ``name`` from ``source``, cut to the first ``limit_*`` examples (0: all).

    ``reachable`` replaces the network probe (tests simulate no network).
    """
    if name not in DATASETS:
        raise ValueError(f"dataset: {name!r} is not one of {', '.join(DATASET_NAMES)}")
    if source not in SOURCES:
        raise ValueError(f"source: {source!r} is not one of {', '.join(SOURCES)}")
    shape = DATASETS[name]
    if source == "synthetic":
        train_count = limit_train or shape.train_examples
        test_count = limit_test or shape.test_examples
        return Splits(
            shape=shape,
            source=source,
            train=synthetic_split(shape, train_count, seed, split_index=0),
            test=synthetic_split(shape, test_count, seed, split_index=1),
            train_examples=train_count,
            test_examples=test_count,
        )
    train, train_count, directory = _tfds_split(shape, "train", limit_train, data_dir, try_gcs, log, reachable)
    test, test_count, _ = _tfds_split(shape, "test", limit_test, data_dir, try_gcs, log, reachable)
    return Splits(shape, source, train, test, train_count, test_count, data_dir=directory)


def _split_text(split: str, limit: int) -> str:
    return f"{split}[:{limit}]" if limit else split


def _tfds_split(shape, split, limit, data_dir, try_gcs, log, reachable):
    import tensorflow_datasets as tfds

    # tqdm bars go straight to fd 2; the live views show progress themselves.
    tfds.disable_progress_bar()
    directory = effective_data_dir(data_dir)
    arguments = dict(
        split=_split_text(split, limit),
        data_dir=str(data_dir) if data_dir else None,
        as_supervised=True,
        try_gcs=try_gcs,
    )
    try:
        dataset = tfds.load(shape.name, download=False, **arguments)
    except AssertionError:
        # tfds's way of saying "no prepared copy in data_dir".
        probe = reachable or network_reachable
        if not probe(shape.download_hosts):
            raise DatasetUnavailable(unavailable_message(shape, directory)) from None
        if log is not None:
            log(f"{shape.title} is not in {directory}: downloading and preparing it there (once)", "info")
        dataset = tfds.load(shape.name, download=True, **arguments)
    if limit:
        # Split slicing already reads only a prefix; take() also holds for
        # builders that ignore slicing (tfds.testing.mock_data).
        dataset = dataset.take(limit)
    return dataset, count_examples(dataset), directory


def count_examples(dataset: Any) -> int:
    """The number of elements, from the cardinality when tf.data knows it."""
    import tensorflow as tf

    cardinality = int(dataset.cardinality())
    if cardinality >= 0:
        return cardinality
    if cardinality == tf.data.INFINITE_CARDINALITY:
        raise ValueError("the dataset is infinite")
    return int(dataset.reduce(0, lambda count, _: count + 1))


def class_patterns(shape: DatasetShape, seed: int):
    """One seeded float32 pattern in [0, 1] per class: a blocky low-resolution image."""
    import numpy as np

    rng = np.random.default_rng([seed, 20_240_101])
    height, width, channels = shape.image_shape
    block = 4
    coarse = rng.random((shape.num_classes, height // block, width // block, channels))
    patterns = np.repeat(np.repeat(coarse, block, axis=1), block, axis=2)
    return patterns.astype("float32")


def synthetic_split(shape: DatasetShape, count: int, seed: int, split_index: int, noise: float = 0.35):
    """``count`` synthetic (uint8 image, int64 label) pairs, the same for the same seed.

    Example ``i`` depends only on (seed, split, i): labels are uniform over the
    classes, images are the class pattern at a random contrast in [0.5, 1]
    plus N(0, ``noise``) per pixel, clipped and quantised to uint8.
    """
    import tensorflow as tf

    patterns = tf.constant(class_patterns(shape, seed))
    stream = tf.constant(seed * 2 + split_index, dtype=tf.int64)

    def example(index):
        label_seed = tf.stack([stream, index])
        label = tf.random.stateless_uniform([], seed=label_seed, minval=0, maxval=shape.num_classes, dtype=tf.int64)
        contrast = tf.random.stateless_uniform([], seed=label_seed + [0, 1 << 40], minval=0.5, maxval=1.0)
        speckle = tf.random.stateless_normal(shape.image_shape, seed=label_seed + [0, 2 << 40], stddev=noise)
        image = tf.gather(patterns, label) * contrast + speckle
        image = tf.cast(tf.clip_by_value(image, 0.0, 1.0) * 255.0 + 0.5, tf.uint8)
        return image, label

    return tf.data.Dataset.range(count).map(example, num_parallel_calls=tf.data.AUTOTUNE)


def without_tuning_thread(dataset: Any):
    """``dataset`` with tf.data's autotuning model switched off.

    Deleting an iterator waits for its tuning thread, which sleeps up to a
    minute between rounds and is not woken by the deletion: runs ended 40
    to 220 s late (measured with TF 2.21, 8 CPU replicas), at every Keras
    validation, at the end of every run and at exit. Without the model,
    AUTOTUNE still resolves: parallel maps use the thread pool's size and
    prefetch buffers grow on demand.
    """
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def scale_batch(images, labels):
    """uint8 [0, 255] → float32 [0, 1], on a whole batch at once."""
    import tensorflow as tf

    return tf.cast(images, tf.float32) / 255.0, labels


def training_pipeline(dataset: Any, batch_size: int, seed: int, input_context: Any = None):
    """Endless shuffled batches for training: cache, shuffle, repeat, batch, scale, prefetch.

    ``batch_size`` is the global batch for ``fit``, or the per-replica batch
    when called from ``distribute_datasets_from_function`` (then
    ``input_context`` shards the data between the input pipelines).
    Batches are full (drop_remainder): a TPU needs static shapes, and an epoch
    is a whole number of steps anyway.
    """
    import tensorflow as tf

    if input_context is not None and input_context.num_input_pipelines > 1:
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = dataset.cache()
    dataset = dataset.shuffle(SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.repeat()
    dataset = dataset.batch(batch_size, drop_remainder=True)
    dataset = dataset.map(scale_batch, num_parallel_calls=tf.data.AUTOTUNE)
    return without_tuning_thread(dataset.prefetch(tf.data.AUTOTUNE))


def evaluation_pipeline(dataset: Any, batch_size: int, drop_remainder: bool = False, input_context: Any = None):
    """Every example once, in order: (shard), cache, batch, scale, prefetch."""
    import tensorflow as tf

    if input_context is not None and input_context.num_input_pipelines > 1:
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = dataset.cache()
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    dataset = dataset.map(scale_batch, num_parallel_calls=tf.data.AUTOTUNE)
    return without_tuning_thread(dataset.prefetch(tf.data.AUTOTUNE))


def evaluation_steps(examples: int, batch_size: int, drop_remainder: bool = False) -> int:
    """Batches in one pass of ``evaluation_pipeline``."""
    return examples // batch_size if drop_remainder else -(-examples // batch_size)
