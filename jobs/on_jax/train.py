"""The ``train`` job on JAX: the same Keras 3 models, plan, reports and summary, under ``keras.distribution.DataParallel``.

``jobs.train.run_training`` drives the run on either framework; this is its
JAX side (``JaxTraining``). The model is built and trained inside a
``DataParallel`` distribution over the runtime's mesh (``ctx.runtime.strategy``:
its one axis, over every device), so every variable is replicated on every
device and every global batch is split along that axis, as MirroredStrategy
and TPUStrategy split it on TensorFlow. Keras ``fit`` trains
(``jobs.trainloops.fit_and_report``: the same compile, reporting callback,
validation at every epoch's end, early stopping and final test as the
TensorFlow job's ``fit``).

Without TensorFlow there is no tf.data: both splits stay the NumPy arrays
``jobs.datasets`` made (tfds only where ``tensorflow_datasets`` is installed;
elsewhere the synthetic set, and the run says so). Training reads them through
``ShuffledBatches`` (a ``keras.utils.PyDataset``: a fresh seeded permutation
every epoch, whole global batches scaled to [0, 1] as they are read);
``Evaluator`` validates every example once in global batches (the last one
padded and masked), and splits each batch's per-example figures by the rows
each device held, for the same ``val loss per replica`` values.

TensorBoard's epoch scalars are written without TensorFlow
(``jobs.tfevents``). What has no JAX counterpart here is said, never skipped
silently: the custom loop of TensorFlow's "Use TPUs" guide (``loop=custom``
trains with ``fit``, with a warning), op determinism (TensorFlow's switch),
and the advice's tf.data pipeline rules and FLOPs count (the advice says
"not checked: …"). JAX is imported inside functions only.
"""

from __future__ import annotations

import contextlib
from typing import Any

from jobs import datasets as data
from jobs.tfevents import EventFileScalars
from jobs.train import run_training
from jobs.trainloops import compile_for_fit, fit_and_report
from jobs.trainplan import TrainingPlan
from jobs.trainreport import STAGE_EVALUATING, replica_means, report_per_replica
from jobs.trainworkers import check_workers

CUSTOM_LOOP_ON_JAX = (
    'loop=custom is the custom loop of TensorFlow\'s "Use TPUs" guide (tf.distribute), which JAX has not: '
    "Keras fit trains instead under keras.distribution.DataParallel, with the same reports"
)
NO_TF_DATA = "the input is NumPy batches (a keras.utils.PyDataset), not a tf.data pipeline, which these rules read"
DETERMINISM_ON_JAX = (
    "deterministic: JAX has no op-determinism switch to set (TensorFlow's enable_op_determinism); "
    "XLA's CPU and TPU programs give the same losses for the same seed"
)


class JaxTraining:
    """The train job's JAX side, driven by ``jobs.train.run_training`` (see ``TensorFlowTraining`` for TensorFlow's)."""

    framework = "jax"
    tf_data = False

    def __init__(self, ctx: Any, params: dict):
        import keras

        check_workers(params, ctx.runtime)  # one process: no cluster, so workers must be 1
        self.ctx = ctx
        self.keras = keras
        self.cluster = None
        mesh = ctx.runtime.strategy
        self.axis = mesh.axis_names[0]
        devices = list(mesh.devices.flatten())
        self.replicas = len(devices)
        device_mesh = keras.distribution.DeviceMesh(shape=(len(devices),), axis_names=[self.axis], devices=devices)
        self.distribution = keras.distribution.DataParallel(device_mesh=device_mesh)
        self.loop = "fit"
        self.loop_warning = CUSTOM_LOOP_ON_JAX if params["loop"] == "custom" else None
        self.writes_summaries = True

    def scalars(self, tensorboard_dir):
        return EventFileScalars(tensorboard_dir)  # TensorFlow's tf.summary is not here

    def source(self, params: dict) -> str:
        return data.source_here(params["source"], data.DATASETS[params["dataset"]], self.ctx.log)

    @contextlib.contextmanager
    def determinism(self, enabled: bool):
        if enabled:
            self.ctx.log(DETERMINISM_ON_JAX)
        yield

    def build_scope(self):
        return self.distribution.scope()

    def advice_inputs(self, splits: data.Splits, plan: TrainingPlan, seed: int) -> dict:
        return {"no_dataset_why": NO_TF_DATA}

    def train(self, model, recipe, params: dict, plan: TrainingPlan, splits: data.Splits, reporter) -> bool:
        keras = self.keras
        with self.distribution.scope():
            compile_for_fit(keras, model, recipe, params, plan)
            train = shuffled_batches(keras, splits.train, plan, params["seed"])
            evaluate = Evaluator(self.ctx, keras, model, recipe.from_logits, splits.test, plan, reporter.stage)
            return fit_and_report(self.ctx, keras, model, params, plan, train, evaluate, reporter)


def run_train_jax(ctx: Any, params: dict) -> dict:
    """The ``train`` job's JAX runner (``JobSpec.run_jax``)."""
    return run_training(ctx, params, JaxTraining(ctx, params))


def epoch_order(examples: int, seed: int, epoch: int):
    """The order an epoch reads the training examples in: a permutation seeded by (seed, epoch)."""
    import numpy as np

    return np.random.default_rng([seed, epoch, 20_240_103]).permutation(examples)


def shuffled_batches(keras, arrays: tuple, plan: TrainingPlan, seed: int):
    """``plan.steps_per_epoch`` global batches an epoch, reshuffled every epoch, images scaled as they are read."""
    images, labels = arrays
    batch = plan.global_batch

    class ShuffledBatches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()
            self.epoch = 0
            self.order = epoch_order(len(labels), seed, self.epoch)

        def __len__(self) -> int:
            return plan.steps_per_epoch

        def __getitem__(self, index: int):
            chosen = self.order[index * batch : (index + 1) * batch]
            return data.scaled_images(images[chosen]), labels[chosen]

        def on_epoch_end(self) -> None:
            self.epoch += 1
            self.order = epoch_order(len(labels), seed, self.epoch)

    return ShuffledBatches()


class Evaluator:
    """Loss and accuracy on the test split, every example once, and what each device measured on its rows.

    ``DataParallel`` gives device ``d`` rows ``d × b``–``(d + 1) × b - 1`` of
    every global batch (``b`` the batch per replica): summing each device's
    rows gives its share, as TensorFlow's replicas have theirs. The last batch
    is dealt out evenly (``device_rows``) and padded to a whole global batch
    (one compiled shape); its padding counts for nothing. On a TPU only whole
    batches are read, as there.
    """

    def __init__(self, ctx, keras, model, from_logits: bool, arrays: tuple, plan: TrainingPlan, stage):
        self.ctx = ctx
        self.keras = keras
        self.model = model
        self.images, self.labels = arrays
        self.plan = plan
        self.stage = stage
        self.devices = ctx.replica_devices()
        self.loss_function = keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits, reduction=None)

    def __call__(self, split: str) -> dict | None:
        import numpy as np

        self.stage(STAGE_EVALUATING)
        plan = self.plan
        batch, replicas = plan.global_batch, plan.replicas
        examples = plan.evaluation_steps * batch if plan.drop_partial_test_batch else len(self.labels)
        loss_totals, correct_totals, counts = (np.zeros(replicas) for _ in range(3))
        for start in range(0, examples, batch):
            size = min(batch, examples - start)
            rows = device_rows(size, replicas, plan.per_replica_batch)
            images = np.zeros((batch, *self.images.shape[1:]), np.float32)
            images[rows] = data.scaled_images(self.images[start : start + size])
            labels = np.zeros(batch, self.labels.dtype)
            labels[rows] = self.labels[start : start + size]
            counted = np.zeros(batch)
            counted[rows] = 1.0
            outputs = self.model.predict_on_batch(images)
            losses = np.asarray(self.keras.ops.convert_to_numpy(self.loss_function(labels, outputs)), np.float64)
            correct = (np.argmax(np.asarray(outputs), axis=-1) == labels).astype(np.float64)
            # Each device's rows are one contiguous block of the global batch.
            loss_totals += (losses * counted).reshape(replicas, -1).sum(axis=1)
            correct_totals += (correct * counted).reshape(replicas, -1).sum(axis=1)
            counts += counted.reshape(replicas, -1).sum(axis=1)
            if self.ctx.cancelled():
                return None
        if split == "val":
            per_replica = {
                "loss": replica_means(zip(loss_totals, counts)),
                "accuracy": replica_means(zip(correct_totals, counts)),
            }
            report_per_replica(self.ctx, split, per_replica, self.devices)
        total = float(counts.sum())
        return {"loss": float(loss_totals.sum()) / total, "accuracy": float(correct_totals.sum()) / total}


def device_rows(size: int, replicas: int, per_replica: int):
    """Where ``size`` examples go in a global batch of ``replicas`` blocks of ``per_replica`` rows.

    A whole batch fills every row in order. A partial one is dealt out as TensorFlow rebatches one:
    as evenly as it goes, the first devices one more, each device's examples at the start of its block.
    """
    import numpy as np

    if size == replicas * per_replica:
        return np.arange(size)
    shares = [len(share) for share in np.array_split(np.arange(size), replicas)]
    return np.concatenate([device * per_replica + np.arange(share) for device, share in enumerate(shares)])
