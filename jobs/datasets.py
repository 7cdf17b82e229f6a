"""Image datasets for the training jobs: MNIST, Fashion-MNIST and CIFAR-10.

Two sources with the same shapes and classes:

- ``tfds``: ``tfds.load(name, split, data_dir, as_supervised=True,
  try_gcs=<on a TPU>)``, as the Colab TPU walkthrough does. With no local
  copy tfds would download; offline it retries for minutes. So the local
  copy is looked for first (``download=False`` answers at once), and only if
  it is missing are the download hosts probed (a few seconds at most):
  unreachable hosts end the run at once with a message naming the data dir,
  ``--data-dir`` and ``source=synthetic``.
- ``synthetic``: a learnable stand-in made with NumPy: each class has a
  seeded pattern; an example is its class pattern at a random contrast plus
  Gaussian noise, as uint8 like the real images. Every output says it is
  synthetic.

Both splits are made once per run into host memory (uint8 images, int64
labels: 55 MB for MNIST's 70,000, 185 MB for CIFAR-10's 60,000), chunk by
chunk with progress, before any pipeline exists; every pipeline then slices
the same tensors. Building them inside tf.data instead made every
per-replica pipeline generate or decode the whole set and keep its shard
(8 × 60,000 examples before the first step: 34 s of silence on 2 cores).

The input pipelines follow the Cloud TPU performance guide's tf.data rules:
``cache`` of the small uint8 shard, ``shuffle`` before ``repeat``, ``batch``
with the global batch (per-replica batch × replicas), the scaling to [0, 1]
mapped on whole batches (a vectorised map, which keeps the cache four times
smaller than caching float32), ``prefetch`` last. tf.data's background
tuning thread is switched off (without_tuning_thread). Nothing here imports
tensorflow at module level.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.base import param_advice

SOURCES = ("tfds", "synthetic")
NETWORK_PROBE_SECONDS = 3.0
SHUFFLE_BUFFER = 10_000
# Examples made (or read from tfds) per step of the preparation: a chunk is
# one progress report and, for the synthetic set, one seeded draw.
CHUNK_EXAMPLES = 4096


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
        "fashion_mnist",
        "Fashion-MNIST",
        (28, 28, 1),
        10,
        60_000,
        10_000,
        ("fashion-mnist.s3-website.eu-central-1.amazonaws.com",),
    ),
    "cifar10": DatasetShape("cifar10", "CIFAR-10", (32, 32, 3), 10, 50_000, 10_000, ("www.cs.toronto.edu",)),
}
DATASET_NAMES = tuple(DATASETS)


class DatasetUnavailable(RuntimeError):
    """The requested data cannot be had here; the message says what to do."""


@dataclass
class Splits:
    """The train and test splits, unbatched ``(uint8 image, int64 label)``: tf.data datasets, or NumPy pairs."""

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


def source_here(source: str, shape: DatasetShape, log: Callable[[str, str], None] | None = None) -> str:
    """The source a run without TensorFlow reads: ``source``, or synthetic (saying so) when tfds is not installed.

    tfds reads its files with TensorFlow; a JAX session (Colab's TPU runtime) usually has neither, and a run
    that asked for the default source still trains, on a set that says it is synthetic.
    """
    if source != "tfds" or importlib.util.find_spec("tensorflow_datasets") is not None:
        return source
    if log is not None:
        log(
            f"tensorflow_datasets is not installed here (it reads with TensorFlow): training on synthetic "
            f"{shape.title}-shaped data instead of {shape.title}; pip install tensorflow-datasets for the real one",
            "warning",
        )
    return "synthetic"


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
        threading.Thread(target=probe, args=(target,), name=f"tpudash-probe-{target}", daemon=True) for target in hosts
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if reached.is_set():
            break
    return reached.is_set()


def unavailable_message(shape: DatasetShape, data_dir: str, advise_param: Callable[[str, str], str]) -> str:
    return (
        f"{shape.title} is not in the tfds data dir {data_dir} and its download host "
        f"({', '.join(shape.download_hosts)}) cannot be reached, so tfds would retry for minutes. "
        f"Point --data-dir (or TPUDASH_DATA_DIR) at a directory holding a prepared copy "
        f"(`tfds build {shape.name} --data_dir DIR` on a machine with network), "
        f"or {advise_param('source', 'synthetic')} for a synthetic {shape.title}-shaped set."
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
    progress: Callable[[int, int], None] | None = None,
    advise_param: Callable[[str, str], str] | None = None,
    tf_data: bool = True,
) -> Splits:
    """Both splits of ``name`` from ``source``, cut to the first ``limit_*`` examples (0: all).

    The examples are made or read into memory here; ``progress(done, total)``
    is called after every chunk of both splits together. ``reachable``
    replaces the network probe (tests simulate no network). ``advise_param(name, value)``
    says how to change a param where the run was launched (``JobContext.advise_param``;
    by default, ``tpudash run``'s ``--set``). ``tf_data`` False: each split is the
    NumPy ``(images, labels)`` pair itself (the JAX runners: no TensorFlow).
    """
    if name not in DATASETS:
        raise ValueError(f"dataset: {name!r} is not one of {', '.join(DATASET_NAMES)}")
    if source not in SOURCES:
        raise ValueError(f"source: {source!r} is not one of {', '.join(SOURCES)}")
    shape = DATASETS[name]
    if source == "synthetic":
        counts = (limit_train or shape.train_examples, limit_test or shape.test_examples)
        chunks = [synthetic_chunks(shape, count, seed, split_index) for split_index, count in enumerate(counts)]
        directory = None
    else:
        advice = advise_param or param_advice
        train, train_count, directory = _tfds_split(
            shape, "train", limit_train, data_dir, try_gcs, log, reachable, advice
        )
        test, test_count, _ = _tfds_split(shape, "test", limit_test, data_dir, try_gcs, log, reachable, advice)
        counts = (train_count, test_count)
        chunks = [tfds_chunks(train), tfds_chunks(test)]
    report = ChunkProgress(sum(counts), progress)
    train_arrays, test_arrays = (
        in_memory(split_chunks, count, shape, report) for split_chunks, count in zip(chunks, counts)
    )
    return Splits(
        shape,
        source,
        as_dataset(*train_arrays) if tf_data else train_arrays,
        as_dataset(*test_arrays) if tf_data else test_arrays,
        len(train_arrays[1]),
        len(test_arrays[1]),
        data_dir=directory,
    )


class ChunkProgress:
    """Counts examples over both splits and passes ``(done, total)`` on."""

    def __init__(self, total: int, progress: Callable[[int, int], None] | None):
        self.total = total
        self.done = 0
        self.progress = progress

    def add(self, examples: int) -> None:
        self.done += examples
        if self.progress is not None:
            self.progress(self.done, self.total)


def in_memory(chunks: Iterable[tuple[Any, Any]], count: int, shape: DatasetShape, report: ChunkProgress):
    """``(images, labels)`` NumPy arrays filled from ``chunks`` of at most ``count`` examples."""
    import numpy as np

    images = np.empty((count, *shape.image_shape), np.uint8)
    labels = np.empty((count,), np.int64)
    filled = 0
    for chunk_images, chunk_labels in chunks:
        size = min(len(chunk_labels), count - filled)
        images[filled : filled + size] = np.reshape(chunk_images[:size], (size, *shape.image_shape))
        labels[filled : filled + size] = chunk_labels[:size]
        filled += size
        report.add(size)
        if filled == count:
            break
    return images[:filled], labels[:filled]


def as_dataset(images, labels):
    """Unbatched ``(uint8 image, int64 label)`` over arrays held once in memory.

    The arrays become tensors here, once, so every per-replica pipeline
    slices the same buffers instead of copying them.
    """
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((tf.convert_to_tensor(images), tf.convert_to_tensor(labels)))


def _split_text(split: str, limit: int) -> str:
    return f"{split}[:{limit}]" if limit else split


def _tfds_split(shape, split, limit, data_dir, try_gcs, log, reachable, advise_param):
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
        with absl_warnings_hidden():
            dataset = tfds.load(shape.name, download=False, **arguments)
    except AssertionError:
        # tfds's way of saying "no prepared copy in data_dir".
        probe = reachable or network_reachable
        if not probe(shape.download_hosts):
            raise DatasetUnavailable(unavailable_message(shape, directory, advise_param)) from None
        if log is not None:
            log(f"{shape.title} is not in {directory}: downloading and preparing it there (once)", "info")
        dataset = tfds.load(shape.name, download=True, **arguments)
    if limit:
        # Split slicing already reads only a prefix; take() also holds for
        # builders that ignore slicing (tfds.testing.mock_data).
        dataset = dataset.take(limit)
    return dataset, count_examples(dataset), directory


@contextlib.contextmanager
def absl_warnings_hidden():
    """absl's warnings (Python logging) held back while tfds looks for a local copy.

    Looking in an empty data dir, tfds warns "Variant folder <dir>/mnist/3.0.1
    has no dataset_info.json", naming a folder that does not exist, just
    before the clear DatasetUnavailable message says what to do.
    """
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def tfds_chunks(dataset: Any):
    """A tfds split as NumPy ``(images, labels)`` chunks, decoded in parallel."""
    import tensorflow as tf

    batches = dataset.batch(CHUNK_EXAMPLES, num_parallel_calls=tf.data.AUTOTUNE).prefetch(1)
    return without_tuning_thread(batches).as_numpy_iterator()


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


def synthetic_chunks(shape: DatasetShape, count: int, seed: int, split_index: int, noise: float = 0.35):
    """``count`` synthetic (uint8 images, int64 labels) in chunks, the same for the same seed.

    Chunk ``c`` (examples ``c × CHUNK_EXAMPLES`` on) depends only on (seed,
    split, c), so a shorter set is a prefix of a longer one. Labels are
    uniform over the classes; images are the class pattern at a random
    contrast in [0.5, 1] plus N(0, ``noise``) per pixel, clipped and
    quantised to uint8. One vectorised draw per chunk, not per example.
    """
    import numpy as np

    patterns = class_patterns(shape, seed)
    for chunk, start in enumerate(range(0, count, CHUNK_EXAMPLES)):
        size = min(CHUNK_EXAMPLES, count - start)
        rng = np.random.default_rng([seed, split_index, chunk, 20_240_102])
        # Whole chunks are drawn and cut, so a chunk's examples do not depend on the set's size.
        labels = rng.integers(0, shape.num_classes, CHUNK_EXAMPLES, dtype=np.int64)[:size]
        contrast = rng.uniform(0.5, 1.0, CHUNK_EXAMPLES).astype(np.float32)[:size].reshape(size, 1, 1, 1)
        images = patterns[labels] * contrast
        images += rng.standard_normal((CHUNK_EXAMPLES, *shape.image_shape), dtype=np.float32)[:size] * np.float32(noise)
        np.clip(images, 0.0, 1.0, out=images)
        yield (images * 255.0 + 0.5).astype(np.uint8), labels


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


def scaled_images(images):
    """uint8 [0, 255] NumPy images → float32 [0, 1] (the NumPy side of ``scale_batch``)."""
    import numpy as np

    return np.asarray(images, np.float32) / np.float32(255.0)


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
