"""TpudashCallback under Keras on JAX: what a user of Colab's TPU runtime gets from ``model.fit``.

A small two-class model on a separable numpy set (it learns in a few
epochs): the run's batch and epoch points, validation, examples/s and the
JAX runtime; a fit that fails inside a step, one stopped by Ctrl-C inside a
step; and one fit under ``keras.distribution.DataParallel`` over the 8 CPU
devices, with a value per device.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

jax = pytest.importorskip("jax")  # before Keras: tests/jax/conftest.py has chosen its backend
keras = pytest.importorskip("keras")

from jobs.events import Log, Metric, Progress, ReplicaValues, RunFinished, RunStarted  # noqa: E402
from tpudash.callbacks import TpudashCallback  # noqa: E402
from tpudash.runs.layout import SOURCE_CALLBACK  # noqa: E402

BATCH = 64
TRAIN_BATCHES = 24
VAL_BATCHES = 4


def only_run(store):
    (run_id,) = store.run_ids()
    return store.load(run_id)


def events_of(data, kind):
    return [event for _, event in data.events if isinstance(event, kind)]


def separable(batches: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two classes split by a line through the origin: a model of two Dense layers learns it in a few epochs."""
    generator = np.random.default_rng(seed)
    features = generator.normal(size=(batches * BATCH, 8)).astype("float32")
    return features, (features[:, 0] + features[:, 1] > 0).astype("int32")


def separable_model(name: str = "separable", loss=None):
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="hidden"), keras.layers.Dense(2)],
        name=name,
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.02),
        loss=loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


class BatchesThat(keras.utils.PyDataset):
    """The training set, one batch at a time, whose ``batch_number``-th read raises ``exception``.

    Keras reads a batch inside the train step (its iterator is the step's
    argument), on the training thread: a corrupt record or a Ctrl-C there
    is an exception inside a step.
    """

    def __init__(self, batch_number: int, exception: BaseException):
        super().__init__()
        self.features, self.labels = separable(TRAIN_BATCHES, seed=0)
        self.batch_number, self.exception = batch_number, exception

    def __len__(self):
        return TRAIN_BATCHES

    def __getitem__(self, index):
        if index == self.batch_number:
            raise self.exception
        chosen = slice(index * BATCH, (index + 1) * BATCH)
        return self.features[chosen], self.labels[chosen]


class ThreadNoting(TpudashCallback):
    """TpudashCallback noting which threads Keras called its batch ends on."""

    def __init__(self, **options):
        super().__init__(**options)
        self.batch_end_threads: set[int] = set()

    def on_train_batch_end(self, batch, logs=None):
        self.batch_end_threads.add(threading.get_ident())
        super().on_train_batch_end(batch, logs)


def test_fit_on_jax_records_batches_epochs_validation_and_the_jax_runtime(store):
    features, labels = separable(TRAIN_BATCHES, seed=0)
    val_features, val_labels = separable(VAL_BATCHES, seed=1)
    model = separable_model()
    callback = ThreadNoting(every_n_batches=1)
    history = model.fit(
        features,
        labels,
        batch_size=BATCH,
        epochs=3,
        validation_data=(val_features, val_labels),
        shuffle=False,
        verbose=0,
        callbacks=[callback],
    )

    data = only_run(store)
    assert (data.info.status, data.info.source, data.info.job) == ("done", SOURCE_CALLBACK, "separable")
    assert not data.problems
    started = events_of(data, RunStarted)[0]
    assert started.params["parameters"] == model.count_params() == 8 * 16 + 16 + 16 * 2 + 2
    assert (started.params["epochs"], started.params["steps_per_epoch"]) == (3, TRAIN_BATCHES)
    assert started.params["batch_size"] == BATCH  # read from fit: examples/s, not steps/s
    runtime = started.runtime
    assert (runtime["backend"], runtime["kind"], runtime["device_count"]) == ("jax", "CPU", 8)
    assert runtime["process"] == {"index": 0, "count": 1} and runtime["jax"] == jax.__version__
    assert (runtime["strategy"], runtime["num_replicas"]) == ("none", 1) and "tensorflow" not in runtime
    assert any("no distribution, 1 replica(s) on CPU" in log.text for log in events_of(data, Log))

    # every_n_batches asks for exact points: Keras calls each batch end in order, on the training thread.
    assert callback.batch_end_threads == {threading.get_ident()}

    metrics = events_of(data, Metric)
    batch_losses = [metric for metric in metrics if metric.name == "batch_loss"]
    assert [metric.step for metric in batch_losses] == list(range(1, 3 * TRAIN_BATCHES + 1))
    for epoch in (1, 2, 3):
        points = [metric for metric in batch_losses if metric.epoch == epoch]
        # Each point is its batch's own loss (Keras logs the epoch's running mean): together, the epoch's loss.
        assert sum(point.value for point in points) / TRAIN_BATCHES == pytest.approx(
            history.history["loss"][epoch - 1], rel=1e-3
        )
    val_losses = [metric.value for metric in metrics if metric.name == "loss" and metric.split == "val"]
    assert val_losses == pytest.approx(history.history["val_loss"])
    assert val_losses[-1] < 0.5 * val_losses[0]  # it learns
    accuracies = [metric.value for metric in metrics if metric.name == "accuracy" and metric.split == "train"]
    assert accuracies[-1] > accuracies[0] and history.history["val_accuracy"][-1] > 0.9
    rates = [metric for metric in metrics if metric.name == "examples_per_second"]
    assert len(rates) == 3 and all(rate.value > 0 for rate in rates)
    epochs = [event for event in events_of(data, Progress) if event.unit == "epoch"]
    assert [(event.done, event.total) for event in epochs] == [(1, 3), (2, 3), (3, 3)]
    assert not events_of(data, ReplicaValues)  # one device: nothing per device to compare
    finished = events_of(data, RunFinished)[0]
    assert finished.summary["epochs"] == 3 and finished.summary["examples_per_second"] > 0


def test_fit_on_jax_that_raises_in_a_step_is_failed_with_its_traceback_or_cancelled(store):
    val_features, val_labels = separable(VAL_BATCHES, seed=1)
    failing = TpudashCallback(name="corrupt-record", every_n_batches=1)
    with pytest.raises(ValueError, match="a corrupt record in shard 3"):
        separable_model().fit(
            BatchesThat(5, ValueError("a corrupt record in shard 3")),
            epochs=2,
            shuffle=False,
            verbose=0,
            callbacks=[failing],
        )
    wrong_shape = TpudashCallback(name="wrong-shape")
    with pytest.raises(ValueError, match="incompatible"):
        separable_model().fit(
            *separable(TRAIN_BATCHES, seed=0),
            batch_size=BATCH,
            epochs=2,
            validation_data=(val_features[:, :6], val_labels),  # six features where the model takes eight
            verbose=0,
            callbacks=[wrong_shape],
        )
    stopped = TpudashCallback(name="ctrl-c")
    with pytest.raises(KeyboardInterrupt):
        # In order: shuffled, batch 7 could come first, in Keras' build before training (and before any run).
        separable_model().fit(
            BatchesThat(7, KeyboardInterrupt()), epochs=2, shuffle=False, verbose=0, callbacks=[stopped]
        )

    by_name = {info.job: info for info in store.list_runs()}
    corrupt = store.load(by_name["corrupt-record"].run_id)
    finished = events_of(corrupt, RunFinished)[0]
    assert finished.status == "failed" and finished.error == "ValueError: a corrupt record in shard 3"
    assert "__getitem__" in finished.traceback  # where it was raised
    # What it did is kept, up to the last batch before the corrupt one (its end may have been still on the pool).
    assert [metric.step for metric in events_of(corrupt, Metric) if metric.name == "batch_loss"][-1] == 5
    shape = events_of(store.load(by_name["wrong-shape"].run_id), RunFinished)[0]
    assert shape.status == "failed" and "expected axis -1 of input shape to have value 8" in shape.error
    assert by_name["ctrl-c"].status == "cancelled"


def test_fit_under_data_parallel_over_8_devices_records_each_devices_copy(store):
    devices = jax.devices()
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    try:
        model = separable_model("data-parallel")  # its variables are laid out over the mesh when made
        callback = ThreadNoting()
        model.fit(*separable(TRAIN_BATCHES, seed=0), batch_size=BATCH, epochs=2, verbose=0, callbacks=[callback])
    finally:
        keras.distribution.set_distribution(None)
    # By default Keras on JAX runs the batch ends on its pool, off the training thread: the loop never waits
    # for a step's logs to reach the host.
    assert callback.batch_end_threads and threading.get_ident() not in callback.batch_end_threads

    data = only_run(store)
    assert data.info.status == "done" and not data.problems
    steps = [metric.step for metric in events_of(data, Metric) if metric.name == "batch_loss"]
    assert steps and steps == sorted(set(steps))  # a batch end that ran late on the pool is not drawn backwards
    runtime = events_of(data, RunStarted)[0].runtime
    assert (runtime["strategy"], runtime["num_replicas"], runtime["mesh"]) == (
        "DataParallel",
        8,
        {"axes": {"batch": 8}},
    )
    assert runtime["simulated"] is True
    assert any("DataParallel over 8 replica(s) on CPU" in log.text for log in events_of(data, Log))
    per_device = events_of(data, ReplicaValues)
    assert len(per_device) == 2  # one per epoch
    last = per_device[-1]
    assert last.name == "‖hidden/kernel‖ per device"  # the largest trainable variable: 8 × 16
    assert last.devices == [str(device) for device in devices]
    kernel = np.asarray(model.get_layer("hidden").kernel.value)
    # Replicated under DataParallel: every device holds the same copy, the one the model ends with.
    assert last.values == pytest.approx([float(np.linalg.norm(kernel))] * 8, rel=1e-5)
    assert per_device[0].values != last.values  # it trained in between
