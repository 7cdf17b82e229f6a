"""What a training run reports while it runs: stages, per-execution and per-epoch metrics, validation.

``TrainingReporter`` turns each execution's and epoch's figures into events
(and TensorBoard scalars); ``Evaluator`` validates on the test split for both
loops, per replica too; the stage names say what a run does while no step
reports progress.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from jobs import datasets as data
from jobs.batchmeans import BatchMeans
from jobs.events import TRAINING_STAGE, Metric, Progress, ReplicaValues, StageAnnouncer
from jobs.trainplan import ProfileWindow, TrainingPlan, distribute
from jobs.trainworkers import cluster_of, cluster_replica_devices, spans_workers

# The stages a training run goes through before and between its steps
# (jobs.events.Stage); the data stage is named after its source.
STAGE_MODEL = "building the model"


STAGE_FIRST_STEP = "tracing and running the first step"


STAGE_TRAINING = TRAINING_STAGE


STAGE_EVALUATING = "evaluating on the test split"


def data_stage_name(dataset: str, source: str) -> str:
    """The data stage of a run: where its examples come from."""
    title = data.DATASETS[dataset].title
    return f"making synthetic {title}-shaped data" if source == "synthetic" else f"loading {title} from tfds"


class TrainingReporter:
    """Turns what either loop observes into events and TensorBoard scalars."""

    def __init__(
        self,
        ctx: Any,
        plan: TrainingPlan,
        tensorboard_dir: Path | None,
        profile: ProfileWindow | None,
        stage: StageAnnouncer | None = None,
        scalars: Any = None,
    ):
        """``tensorboard_dir`` None: no TensorBoard scalars (a worker that is not the chief).

        ``scalars``: who writes them there (``jobs.tfevents.EventFileScalars`` on JAX); None: ``tf.summary``.
        """
        self.ctx = ctx
        self.scalars = scalars
        self.stage = stage or StageAnnouncer(ctx.emit)
        self.plan = plan
        self.profile = profile
        self.tensorboard_dir = tensorboard_dir
        self.writers: dict[str, Any] = {}
        self.scalar_metadata: Any = None
        if tensorboard_dir is not None and scalars is None:
            import tensorflow as tf
            from tensorflow.core.framework import summary_pb2

            self.writers = {
                split: tf.summary.create_file_writer(str(tensorboard_dir / folder))
                for split, folder in (("train", "train"), ("val", "validation"), ("test", "test"))
            }
            self.scalar_metadata = summary_pb2.SummaryMetadata(
                plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
                data_class=summary_pb2.DATA_CLASS_SCALAR,
            )
        self.global_step = 0
        self.epoch = 0
        self.epochs_done = 0
        self.steps_in_epoch = 0
        self.batch_means = BatchMeans()
        self.epoch_started = 0.0
        self.train_seconds: float | None = None
        self.throughputs: list[float] = []
        self.last_train: dict = {}
        self.last_val: dict = {}
        self.test: dict = {}

    def begin_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.steps_in_epoch = 0
        self.batch_means.reset()
        self.train_seconds = None
        self.epoch_started = time.perf_counter()

    def before_execution(self, steps: int) -> None:
        if self.global_step == 0:
            self.stage(STAGE_FIRST_STEP)
        elif self.stage.current != STAGE_TRAINING:
            self.stage(STAGE_TRAINING)
        if self.profile is not None:
            self.profile.before(self.global_step + 1, self.global_step + steps)

    def after_execution(self, steps_done_in_epoch: int, mean_loss: float | None, mean_accuracy: float | None) -> None:
        """``mean_*`` are running means over the epoch so far (what Keras logs)."""
        new_steps = steps_done_in_epoch - self.batch_means.steps
        running = {name: mean for name, mean in (("loss", mean_loss), ("accuracy", mean_accuracy)) if mean is not None}
        values = self.batch_means.since_last(steps_done_in_epoch, running)
        if new_steps <= 0:
            return
        if self.global_step == 0:
            self.stage(STAGE_TRAINING)
        self.global_step += new_steps
        self.steps_in_epoch = steps_done_in_epoch
        emit = self.ctx.emit
        for name, value in values.items():
            if name == "accuracy":
                value = min(1.0, max(0.0, value))
            emit(Metric(name=f"batch_{name}", value=value, step=self.global_step, epoch=self.epoch, split="train"))
        emit(Progress(done=steps_done_in_epoch, total=self.plan.steps_per_epoch, unit="step"))
        if self.profile is not None:
            self.profile.after(self.global_step)

    def end_training_part(self) -> None:
        if self.train_seconds is None:
            self.train_seconds = time.perf_counter() - self.epoch_started

    def end_epoch(self, train: dict, val: dict | None) -> None:
        self.end_training_part()
        examples = self.steps_in_epoch * self.plan.global_batch
        throughput = examples / self.train_seconds if self.train_seconds else 0.0
        self.throughputs.append(throughput)
        self.epochs_done = self.epoch
        self.last_train, self.last_val = dict(train), dict(val or {})
        emit = self.ctx.emit
        for split, values in (("train", train), ("val", val or {})):
            for name, value in values.items():
                emit(Metric(name=name, value=float(value), step=self.global_step, epoch=self.epoch, split=split))
        emit(
            Metric(name="examples_per_second", value=throughput, step=self.global_step, epoch=self.epoch, split="train")
        )
        advisor = getattr(self.ctx, "advisor", None)
        if advisor is not None:  # the run's advice: compile marks and MFU from this epoch's steps/s
            steps_per_second = self.steps_in_epoch / self.train_seconds if self.train_seconds else None
            mfu = advisor.epoch_end(self.epoch, self.global_step, steps_per_second).mfu
            if mfu is not None and mfu.mfu is not None:
                emit(Metric(name="mfu", value=mfu.mfu, step=self.global_step, epoch=self.epoch, split="train"))
        for split, values in (("train", dict(train, examples_per_second=throughput)), ("val", val or {})):
            for name, value in values.items():
                self.scalar(split, f"epoch_{name}", value, self.epoch)
        emit(Progress(done=self.epoch, total=self.plan.epochs, unit="epoch"))

    def report_test(self, results: dict) -> None:
        self.test = {name: float(value) for name, value in results.items()}
        for name, value in self.test.items():
            self.ctx.emit(Metric(name=name, value=value, step=self.global_step, epoch=self.epochs_done, split="test"))
            self.scalar("test", f"epoch_{name}", value, max(self.epochs_done, 1))

    def scalar(self, split: str, tag: str, value: float, step: int) -> None:
        """One TensorBoard scalar, written without the tensorboard package.

        ``tf.summary.scalar`` lives in tensorboard (not a dependency); the
        core ``tf.summary.write`` with the scalars plugin's metadata writes
        the same event that TensorBoard's Scalars tab reads.
        """
        if self.scalars is not None:
            self.scalars.write(split, tag, value, step)
            return
        if split not in self.writers:
            return
        import tensorflow as tf

        with self.writers[split].as_default():
            tf.summary.write(tag, tf.constant(float(value), tf.float32), step=step, metadata=self.scalar_metadata)

    def examples_per_second(self) -> float | None:
        """The steady rate: epochs after the first (which pays for tracing and the cache fill)."""
        steady = self.throughputs[1:] or self.throughputs
        return sum(steady) / len(steady) if steady else None

    def close(self) -> None:
        if self.scalars is not None:
            self.scalars.close()
        for writer in self.writers.values():
            writer.flush()
            writer.close()


class Evaluator:
    """Loss and accuracy on the test split over every replica, for val and test alike.

    Each call is one pass over the distributed test set (every example once;
    the last batches may be partial off a TPU). Both loops use it, in place
    of Keras's validation, so val figures are computed the same way.
    """

    def __init__(self, ctx, tf, keras, strategy, model, from_logits: bool, dataset, stage: StageAnnouncer):
        self.ctx = ctx
        self.stage = stage
        self.dataset = dataset
        self.strategy = strategy
        self.devices = ctx.replica_devices()
        with strategy.scope():
            self.loss = keras.metrics.Mean(name="loss")
            self.accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        loss_function = keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits, reduction="none")
        # A worker of a cluster holds only its own replicas' shares: every replica's are gathered.
        self.gather_shares = None
        cluster = cluster_of(ctx.runtime)
        if cluster is not None and spans_workers(strategy):
            local = list(getattr(strategy.extended, "worker_devices", ()) or ())
            self.devices = cluster_replica_devices(local, cluster)
            self.gather_shares = shares_gatherer(tf, strategy, (self.loss, self.accuracy))

        def replica_step(inputs):
            images, labels = inputs
            outputs = model(images, training=False)
            self.loss.update_state(loss_function(labels, outputs))
            self.accuracy.update_state(labels, outputs)

        @tf.function(reduce_retracing=True)
        def step(inputs):
            strategy.run(replica_step, args=(inputs,))

        self.step = step

    def __call__(self, split: str) -> dict | None:
        """One pass over the test split as ``split`` (val or test); None if the run was cancelled meanwhile.

        What each replica measured on its share goes out as ReplicaValues (val only).
        """
        self.stage(STAGE_EVALUATING)
        self.loss.reset_state()
        self.accuracy.reset_state()
        for inputs in self.dataset:
            self.step(inputs)
            if self.ctx.cancelled():
                return None
        if split == "val":
            report_per_replica(self.ctx, split, self.per_replica(), self.devices)
        return {"loss": float(self.loss.result()), "accuracy": float(self.accuracy.result())}

    def per_replica(self) -> dict[str, list[float]]:
        """The last pass's loss and accuracy on each replica's own share of the test split.

        The metrics' totals and counts are sync-on-read variables: one
        component per replica, summed only when read as a whole.
        """
        shares = {}
        if self.gather_shares is not None:
            # One row per replica of the cluster: loss total, loss count, accuracy total, accuracy count.
            rows = self.strategy.experimental_local_results(self.gather_shares())[0].numpy().tolist()
            parts = {"loss": [(row[0], row[1]) for row in rows], "accuracy": [(row[2], row[3]) for row in rows]}
        else:
            parts = {
                name: list(
                    zip(
                        self.strategy.experimental_local_results(metric.total.value),
                        self.strategy.experimental_local_results(metric.count.value),
                    )
                )
                for name, metric in (("loss", self.loss), ("accuracy", self.accuracy))
            }
        for name, pairs in parts.items():
            shares[name] = replica_means(pairs)
        return shares


def replica_means(pairs) -> list[float]:
    """Each replica's mean from its ``(total, count)``; NaN for a replica that saw no example."""
    return [float(total) / float(count) if float(count) else float("nan") for total, count in pairs]


def report_per_replica(ctx: Any, split: str, per_replica: dict[str, list[float]], devices: list[str]) -> None:
    """What each replica measured on its own share of a validation pass, as ReplicaValues (``val loss per replica``).

    Only for validation: the test pass repeats the last validation with the final weights, and its
    per-replica values would too.
    """
    for name, values in per_replica.items():
        ctx.emit(ReplicaValues(name=f"{split} {name} per replica", values=values, devices=devices))


def shares_gatherer(tf, strategy, metrics):
    """A tf.function returning every replica's (total, count) of each metric, gathered over the cluster.

    A collective: every worker calls it, at the same point (each validates
    every epoch). Read in a replica's context, a metric's sync-on-read total
    is that replica's own component.
    """

    def replica_row():
        parts = [tf.cast(variable.value, tf.float32) for metric in metrics for variable in (metric.total, metric.count)]
        row = tf.reshape(tf.stack(parts), (1, len(parts)))
        return tf.distribute.get_replica_context().all_gather(row, axis=0)

    @tf.function
    def gather():
        return strategy.run(replica_row)

    return gather


def make_evaluator(ctx, tf, keras, strategy, model, recipe, plan, splits, stage: StageAnnouncer) -> Evaluator:
    test = splits.test
    if plan.drop_partial_test_batch:
        # Whole global batches only, so that every replica gets a full batch
        # at every step (a TPU compiles for one shape).
        test = test.take(plan.evaluation_steps * plan.global_batch)

    def make(batch_size, input_context):
        return data.evaluation_pipeline(test, batch_size, plan.drop_partial_test_batch, input_context=input_context)

    dataset = distribute(tf, strategy, ctx.runtime.kind, make, plan.global_batch)
    return Evaluator(ctx, tf, keras, strategy, model, recipe.from_logits, dataset, stage)


def early_stopping_text(epoch: int, patience: int, best_loss: float, restored: bool) -> str:
    kept = (
        f"the weights of the best val_loss {best_loss:.4f} are restored"
        if restored
        else "val_loss never improved, the last weights are kept"
    )
    return f"early stopping after epoch {epoch}: val_loss did not improve for {patience} epochs; {kept}"


def reporting_callback(keras, ctx, reporter, evaluate: Evaluator):
    class Reporting(keras.callbacks.Callback):
        """Keras hooks → reporter; validation at epoch end; cancel → stop_training."""

        def on_epoch_begin(self, epoch, logs=None):
            reporter.begin_epoch(epoch + 1)

        def on_train_batch_begin(self, batch, logs=None):
            reporter.before_execution(reporter.plan.steps_per_execution)

        def on_train_batch_end(self, batch, logs=None):
            logs = logs or {}
            # ``batch`` is the last step of the execution, counted from 0 in the epoch.
            reporter.after_execution(batch + 1, logs.get("loss"), logs.get("accuracy"))
            if ctx.cancelled():
                self.model.stop_training = True

        def on_epoch_end(self, epoch, logs=None):
            if ctx.cancelled():
                return
            reporter.end_training_part()
            val = evaluate("val")
            if val is None:
                self.model.stop_training = True
                return
            if logs is not None:
                # Callbacks after this one (EarlyStopping, History) read val_* here.
                logs.update({f"val_{name}": value for name, value in val.items()})
            train = {name: logs[name] for name in ("loss", "accuracy") if logs and name in logs}
            reporter.end_epoch(train, val)

    return Reporting()
