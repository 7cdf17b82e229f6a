"""The ``train`` job: an image classifier trained on every replica, reported live.

MNIST, Fashion-MNIST or CIFAR-10 through tfds (or a synthetic set of the same
shapes, jobs.datasets), one of the models in jobs.models built under
``strategy.scope()``, trained either by Keras ``fit`` or by the custom loop of
TensorFlow's "Use TPUs" guide (``distribute_datasets_from_function``, per-replica batches,
``tf.nn.compute_average_loss``, ``steps_per_execution`` steps per
``tf.function`` call through ``tf.range``).

What a run reports (events):

- ``Table``: the model summary (layers, output shapes, dtype policy, params).
- ``Metric`` ``batch_loss`` / ``batch_accuracy`` (train) after every execution
  (``steps_per_execution`` steps): the mean over the steps of that execution,
  not Keras's running epoch average, so the curve shows what the model does
  now. ``step`` is the global step.
- ``Metric`` ``loss`` / ``accuracy`` per epoch for split ``train`` and ``val``,
  ``examples_per_second`` per epoch (training part only), and ``loss`` /
  ``accuracy`` for split ``test`` at the end. As in the Colab TPU walkthrough
  and the "Use TPUs" guide the validation data is the test split; early stopping restores the best weights,
  so the final test figures are those of the best epoch. Both loops validate
  with the same Evaluator rather than Keras's validation.
- ``Progress`` in ``step`` units within an epoch and ``epoch`` units overall.
- ``Stage`` while no step reports progress: making or loading the data
  (examples done/total), building the model, tracing and running the first
  step (XLA compilation on a TPU), then ``training``; ``evaluating on the test
  split`` during each validation (the first traces another function) and the
  final test; ``training`` again when the steps resume after a validation.
- ``ReplicaValues`` ``val loss per replica`` / ``val accuracy per replica``
  after every validation: each replica's figures on its own share of the
  test split (the epoch's val metrics are their example-weighted mean).
- ``Artifact`` ``tensorboard`` (epoch scalars under run_dir/tensorboard) and
  ``profile`` (a TensorFlow profiler trace of ``profile_steps``, viewable in
  TensorBoard's profile plugin).
- ``Log`` lines: what is trained on what (synthetic data says so), the Cloud
  TPU performance guide's advice, early stopping, profiler results.

Off a TPU, ``fit`` with ``steps_per_execution`` > 1 runs its executions with
the tf-keras loop (see _multi_step_train_function): Keras 3's own fails under
MirroredStrategy.

Cancel is checked after every execution (and every evaluation batch, and
every chunk of the data being made or loaded): the run ends within one
execution. The global mixed precision policy and op
determinism are restored when the run ends, however it ends.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs import datasets as data
from jobs.base import JobSpec, Param, ParamError
from jobs.batchmeans import BatchMeans
from jobs.events import TRAINING_STAGE, Artifact, Metric, Progress, ReplicaValues, StageAnnouncer
from jobs.models import MODEL_NAMES, MODELS, build_model, parameter_count, summary_table

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
OPTIMIZERS = ("adam", "sgd", "rmsprop", "adamw")
LOOPS = ("fit", "custom")
TPU_MXU = 128
# The stages a training run goes through before and between its steps
# (jobs.events.Stage); the data stage is named after its source.
STAGE_MODEL = "building the model"
STAGE_FIRST_STEP = "tracing and running the first step"
STAGE_TRAINING = TRAINING_STAGE
STAGE_EVALUATING = "evaluating on the test split"
TPU_PADDING = 8


def data_stage_name(dataset: str, source: str) -> str:
    """The data stage of a run: where its examples come from."""
    title = data.DATASETS[dataset].title
    return f"making synthetic {title}-shaped data" if source == "synthetic" else f"loading {title} from tfds"


def parse_profile_steps(text: str) -> tuple[int, int] | None:
    """``"5-10"`` → (5, 10); ``"7"`` → (7, 7); ``""`` → None (no profiling).

    Steps are global training steps counted from 1, both ends included.
    """
    text = (text or "").strip()
    if not text:
        return None
    first_text, separator, last_text = text.partition("-")
    try:
        first = int(first_text.strip(), 10)
        last = int(last_text.strip(), 10) if separator else first
    except ValueError:
        raise ValueError(f"{text!r} is not a step range") from None
    if first < 1 or last < first:
        raise ValueError(f"{text!r} is not a step range from low to high starting at 1 or more")
    return first, last


def _check_profile_steps(value: str) -> str | None:
    try:
        parse_profile_steps(value)
    except ValueError as error:
        return f"{error}; allowed: empty (no profiling), N, or N-M with 1 <= N <= M (global steps), e.g. 5-10"
    return None


PARAMS = (
    Param("dataset", "str", "mnist", "images to classify", choices=data.DATASET_NAMES),
    Param("source", "str", "tfds", "tfds: the real data (data dir, download); synthetic: a learnable stand-in "
          "of the same shapes, no files needed", choices=data.SOURCES),
    Param("model", "str", "light", "light: small CPU-friendly CNN; mnist-cnn: the MNIST CNN of TensorFlow's "
          "\"Use TPUs\" guide; cifar-cnn: the Colab TPU walkthrough's CIFAR-10 CNN (225,034 params)",
          choices=MODEL_NAMES),
    Param("epochs", "int", 5, "passes over the training split", minimum=1, maximum=100_000),
    Param("batch_per_replica", "int", 64, "examples per replica per step; global batch = this × replicas",
          minimum=1, maximum=1 << 20),
    Param("learning_rate", "float", 0.001, "optimizer step size", minimum=0.0, maximum=10.0, minimum_exclusive=True),
    Param("optimizer", "str", "adam", "optimizer", choices=OPTIMIZERS),
    Param("precision", "str", "float32", "Keras dtype policy; the output layer always stays float32",
          choices=PRECISIONS),
    Param("steps_per_execution", "int", 1, "training steps per tf.function call (the \"Use TPUs\" guide uses "
          "50)", minimum=1, maximum=100_000),
    Param("loop", "str", "fit", "fit: Keras model.fit; custom: the \"Use TPUs\" guide's custom training loop",
          choices=LOOPS),
    Param("early_stopping_patience", "int", 0, "stop after this many epochs without a better val_loss "
          "(0 = off)", minimum=0, maximum=100_000),
    Param("deterministic", "bool", False, "op determinism (tf.config.experimental.enable_op_determinism) "
          "so a rerun gives identical losses"),
    Param("seed", "int", 42, "seed for weights, shuffling and the synthetic data", minimum=0, maximum=2**31 - 1),
    Param("limit_train", "int", 0, "use only the first N training examples (0 = all)", minimum=0,
          maximum=10_000_000),
    Param("limit_test", "int", 0, "use only the first N test examples (0 = all)", minimum=0, maximum=10_000_000),
    Param("profile_steps", "str", "", "capture a profiler trace of these global steps, e.g. 5-10 "
          "(empty = off)", check=_check_profile_steps),
)


def check_runtime(params: dict, runtime: Any) -> None:
    """Rules that need the replica count: a limit must hold at least one global batch."""
    global_batch = params["batch_per_replica"] * int(runtime.num_replicas)
    limit = params["limit_train"]
    if limit and limit < global_batch:
        raise ParamError(
            "limit_train",
            f"{limit} is fewer than one global batch ({params['batch_per_replica']} per replica × "
            f"{runtime.num_replicas} replicas = {global_batch}); allowed: 0 (all) or >= {global_batch}",
        )


def tpu_advice(kind: str, per_replica_batch: int, replicas: int, steps_per_execution: int, precision: str) -> list[str]:
    """The Cloud TPU performance guide's pitfalls that these params run into (none off a TPU)."""
    if kind != "TPU":
        return []
    advice = []
    global_batch = per_replica_batch * replicas
    if global_batch % TPU_MXU:
        advice.append(
            f"global batch {global_batch} is not a multiple of {TPU_MXU}: the 128×128 matrix units pad it "
            f"and waste {1 - global_batch / (math.ceil(global_batch / TPU_MXU) * TPU_MXU):.0%} of their work"
        )
    if per_replica_batch % TPU_PADDING:
        advice.append(
            f"batch per replica {per_replica_batch} is not a multiple of {TPU_PADDING}: XLA pads it to "
            f"{math.ceil(per_replica_batch / TPU_PADDING) * TPU_PADDING}"
        )
    if steps_per_execution == 1:
        advice.append(
            "steps_per_execution is 1: every step is a round trip to the TPU host; "
            "TensorFlow's \"Use TPUs\" guide measured ~2× faster steps with steps_per_execution=50"
        )
    if precision == "float32":
        advice.append("precision float32 on a TPU: mixed_bfloat16 uses the bfloat16 matrix units "
                      "(TensorFlow's mixed precision guide)")
    return advice


@dataclass(frozen=True)
class TrainingPlan:
    """The numbers a run is made of, fixed before the first step."""

    replicas: int
    per_replica_batch: int
    global_batch: int
    train_examples: int
    test_examples: int
    steps_per_epoch: int
    steps_per_execution: int
    epochs: int
    drop_partial_test_batch: bool
    evaluation_steps: int

    @classmethod
    def make(cls, params: dict, replicas: int, train_examples: int, test_examples: int,
             drop_partial_test_batch: bool = False) -> "TrainingPlan":
        global_batch = params["batch_per_replica"] * replicas
        if train_examples < global_batch:
            raise data.DatasetUnavailable(
                f"the training split has {train_examples} examples, fewer than one global batch of {global_batch}; "
                f"lower batch_per_replica or raise limit_train"
            )
        steps = train_examples // global_batch
        per_execution = min(params["steps_per_execution"], steps)
        # Whole executions per epoch: Keras runs full executions only, and
        # both loops then see identical epochs.
        steps = steps // per_execution * per_execution
        evaluation_steps = data.evaluation_steps(test_examples, global_batch, drop_partial_test_batch)
        if evaluation_steps < 1:
            raise data.DatasetUnavailable(
                f"the test split has {test_examples} examples, fewer than one global batch of {global_batch} "
                f"(a TPU evaluates full batches only); lower batch_per_replica or raise limit_test"
            )
        return cls(replicas, params["batch_per_replica"], global_batch, train_examples, test_examples,
                   steps, per_execution, params["epochs"], drop_partial_test_batch, evaluation_steps)


class ProfileWindow:
    """Starts the TensorFlow profiler before ``first`` and stops it after ``last`` (global steps)."""

    def __init__(self, ctx: Any, steps: tuple[int, int], logdir: Path):
        self.ctx = ctx
        self.first, self.last = steps
        self.logdir = logdir
        self.state = "waiting"  # waiting → tracing → done
        self.trace_dir: Path | None = None
        self.trace_bytes = 0

    def before(self, first_step: int, last_step: int) -> None:
        if self.state != "waiting" or last_step < self.first:
            return
        import tensorflow as tf

        try:
            tf.profiler.experimental.start(str(self.logdir))
        except Exception as error:  # noqa: BLE001 - profiling is an extra; training goes on
            self.state = "done"
            self.ctx.log(f"profiler did not start ({type(error).__name__}: {error}); training continues", "warning")
            return
        self.state = "tracing"
        self.ctx.log(f"profiler tracing from step {first_step} to step {self.last}")

    def after(self, step_done: int) -> None:
        if self.state == "tracing" and step_done >= self.last:
            self.stop()

    def stop(self) -> None:
        if self.state != "tracing":
            return
        import tensorflow as tf

        self.state = "done"
        try:
            tf.profiler.experimental.stop()
        except Exception as error:  # noqa: BLE001
            self.ctx.log(f"profiler did not stop cleanly ({type(error).__name__}: {error})", "warning")
        traces = sorted(self.logdir.glob("plugins/profile/*/*.xplane.pb"))
        self.trace_bytes = sum(path.stat().st_size for path in traces)
        if not traces or self.trace_bytes == 0:
            self.ctx.log(f"profiler wrote no trace under {self.logdir}/plugins/profile", "warning")
            return
        self.trace_dir = traces[-1].parent
        self.ctx.emit(Artifact(kind="profile", path=str(self.trace_dir)))
        self.ctx.log(
            f"profiler trace of steps {self.first}-{self.last}: {self.trace_bytes:,} bytes in {self.trace_dir} "
            f"(tensorboard --logdir {self.logdir}, Profile tab)"
        )

    def finish(self, last_step: int) -> None:
        """Stop a trace cut short by the end of the run; say when the range was never reached."""
        if self.state == "tracing":
            self.stop()
        elif self.state == "waiting":
            self.state = "done"
            self.ctx.log(
                f"profile_steps {self.first}-{self.last} was never reached (the run ended at step {last_step}): "
                f"no trace",
                "warning",
            )


class TrainingReporter:
    """Turns what either loop observes into events and TensorBoard scalars."""

    def __init__(self, ctx: Any, plan: TrainingPlan, tensorboard_dir: Path, profile: ProfileWindow | None,
                 stage: StageAnnouncer | None = None):
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2

        self.ctx = ctx
        self.stage = stage or StageAnnouncer(ctx.emit)
        self.plan = plan
        self.profile = profile
        self.tensorboard_dir = tensorboard_dir
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
        emit(Metric(name="examples_per_second", value=throughput, step=self.global_step, epoch=self.epoch, split="train"))
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
        import tensorflow as tf

        with self.writers[split].as_default():
            tf.summary.write(tag, tf.constant(float(value), tf.float32), step=step, metadata=self.scalar_metadata)

    def examples_per_second(self) -> float | None:
        """The steady rate: epochs after the first (which pays for tracing and the cache fill)."""
        steady = self.throughputs[1:] or self.throughputs
        return sum(steady) / len(steady) if steady else None

    def close(self) -> None:
        for writer in self.writers.values():
            writer.flush()
            writer.close()


@contextlib.contextmanager
def precision_policy(name: str):
    """The global Keras dtype policy ``name`` for the run, the previous one after."""
    import keras

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


@contextlib.contextmanager
def op_determinism(enabled: bool):
    """tf.config.experimental.enable_op_determinism for the run, undone after."""
    if not enabled:
        yield
        return
    import tensorflow as tf
    from tensorflow.python.framework import config as tf_config

    was_enabled = tf_config.is_op_determinism_enabled()
    tf.config.experimental.enable_op_determinism()
    try:
        yield
    finally:
        if not was_enabled:
            tf_config.disable_op_determinism()


def make_optimizer(name: str, learning_rate: float, precision: str):
    import keras

    classes = {
        "adam": keras.optimizers.Adam,
        "sgd": keras.optimizers.SGD,
        "rmsprop": keras.optimizers.RMSprop,
        "adamw": keras.optimizers.AdamW,
    }
    optimizer = classes[name](learning_rate=learning_rate)
    if precision == "mixed_float16":
        # float16 gradients underflow without loss scaling; compile() would
        # wrap it too, the custom loop needs it done here.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def run_train(ctx: Any, params: dict) -> dict:
    import keras
    import tensorflow as tf

    runtime = ctx.runtime
    strategy = runtime.strategy
    replicas = int(strategy.num_replicas_in_sync)
    settings = ctx.settings
    with op_determinism(params["deterministic"]), precision_policy(params["precision"]):
        keras.utils.set_random_seed(params["seed"])
        stage = StageAnnouncer(ctx.emit)
        data_stage = data_stage_name(params["dataset"], params["source"])

        def data_made(done: int, total: int) -> None:
            ctx.raise_if_cancelled()
            stage(data_stage, done, total)

        stage(data_stage)
        splits = data.load_splits(
            params["dataset"],
            params["source"],
            data_dir=getattr(settings, "data_dir", None),
            try_gcs=runtime.kind == "TPU",
            limit_train=params["limit_train"],
            limit_test=params["limit_test"],
            seed=params["seed"],
            log=ctx.log,
            progress=data_made,
        )
        ctx.raise_if_cancelled()
        # On a TPU every batch needs the same shape; elsewhere the last
        # partial test batch is evaluated too.
        plan = TrainingPlan.make(params, replicas, splits.train_examples, splits.test_examples,
                                 drop_partial_test_batch=runtime.kind == "TPU")
        if plan.drop_partial_test_batch and plan.test_examples % plan.global_batch:
            ctx.log(f"the last {plan.test_examples % plan.global_batch} test examples are left out: "
                    f"a TPU needs full batches", "warning")
        for advice in tpu_advice(runtime.kind, plan.per_replica_batch, replicas, params["steps_per_execution"],
                                 params["precision"]):
            ctx.log(advice, "warning")
        if plan.steps_per_execution != params["steps_per_execution"]:
            ctx.log(f"steps_per_execution lowered to {plan.steps_per_execution}, the steps in one epoch", "warning")

        recipe = MODELS[params["model"]]
        stage(STAGE_MODEL)
        with strategy.scope():
            model = build_model(params["model"], splits.shape.image_shape, splits.shape.num_classes)
        params_count = parameter_count(model)
        ctx.emit(summary_table(model, f"model {params['model']} on {splits.label}: {params_count:,} params"))
        ctx.log(
            f"training {params['model']} ({params_count:,} params) on {splits.label}: "
            f"{splits.train_examples:,} train / {splits.test_examples:,} test examples; "
            f"global batch {plan.global_batch} = {plan.per_replica_batch} per replica × {replicas} replicas "
            f"({runtime.kind}); {plan.steps_per_epoch} steps per epoch, {params['loop']} loop, "
            f"steps_per_execution {plan.steps_per_execution}, precision {params['precision']}"
        )
        tensorboard_dir = Path(ctx.run_dir) / "tensorboard"
        tensorboard_dir.mkdir(parents=True, exist_ok=True)
        ctx.emit(Artifact(kind="tensorboard", path=str(tensorboard_dir)))
        profile_range = parse_profile_steps(params["profile_steps"])
        profile = ProfileWindow(ctx, profile_range, tensorboard_dir) if profile_range else None
        reporter = TrainingReporter(ctx, plan, tensorboard_dir, profile, stage)
        ctx.emit(Progress(done=0, total=plan.epochs, unit="epoch"))
        try:
            if params["loop"] == "fit":
                stopped_early = _train_with_fit(ctx, tf, keras, strategy, model, recipe, params, plan, splits,
                                                reporter)
            else:
                stopped_early = _train_with_custom_loop(ctx, tf, keras, strategy, model, recipe, params, plan,
                                                        splits, reporter)
        finally:
            if profile is not None:
                profile.finish(reporter.global_step)
            reporter.close()

    summary = {
        "data": splits.label,
        "dataset": params["dataset"],
        "source": params["source"],
        "synthetic": splits.source == "synthetic",
        "model": params["model"],
        "params": params_count,
        "loop": params["loop"],
        "precision": params["precision"],
        "replicas": replicas,
        "global_batch": plan.global_batch,
        "steps_per_epoch": plan.steps_per_epoch,
        "steps_per_execution": plan.steps_per_execution,
        "epochs_run": reporter.epochs_done,
        "steps": reporter.global_step,
        "examples_per_second": reporter.examples_per_second(),
        "early_stopped": stopped_early,
        "tensorboard": str(tensorboard_dir),
        "profile": str(profile.trace_dir) if profile is not None and profile.trace_dir else None,
    }
    summary.update({name: value for name, value in reporter.last_train.items()})
    summary.update({f"val_{name}": value for name, value in reporter.last_val.items()})
    summary.update({f"test_{name}": value for name, value in reporter.test.items()})
    if ctx.cancelled():
        ctx.log(f"cancelled after {reporter.global_step} steps (epoch {reporter.epoch})", "warning")
    return summary


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
            # The test pass repeats the last validation with the final weights: its per-replica values would too.
            for name, values in self.per_replica().items():
                self.ctx.emit(ReplicaValues(name=f"{split} {name} per replica", values=values, devices=self.devices))
        return {"loss": float(self.loss.result()), "accuracy": float(self.accuracy.result())}

    def per_replica(self) -> dict[str, list[float]]:
        """The last pass's loss and accuracy on each replica's own share of the test split.

        The metrics' totals and counts are sync-on-read variables: one
        component per replica, summed only when read as a whole.
        """
        shares = {}
        for name, metric in (("loss", self.loss), ("accuracy", self.accuracy)):
            totals = self.strategy.experimental_local_results(metric.total.value)
            counts = self.strategy.experimental_local_results(metric.count.value)
            shares[name] = [float(total) / float(count) if float(count) else float("nan")
                            for total, count in zip(totals, counts)]
        return shares


def _evaluator(ctx, tf, keras, strategy, model, recipe, plan, splits, stage: StageAnnouncer) -> Evaluator:
    test = splits.test
    if plan.drop_partial_test_batch:
        # Whole global batches only, so that every replica gets a full batch
        # at every step (a TPU compiles for one shape).
        test = test.take(plan.evaluation_steps * plan.global_batch)

    def make(batch_size, input_context):
        return data.evaluation_pipeline(test, batch_size, plan.drop_partial_test_batch, input_context=input_context)

    dataset = distribute(tf, strategy, ctx.runtime.kind, make, plan.global_batch)
    return Evaluator(ctx, tf, keras, strategy, model, recipe.from_logits, dataset, stage)


def distribute(tf, strategy, runtime_kind: str, make, global_batch: int):
    """``make(per_replica_batch, input_context)`` distributed over the replicas.

    Off a TPU or GPU (see input_options) every replica gets its own host
    pipeline over its shard of the data.
    """

    def dataset_fn(input_context):
        return make(input_context.get_per_replica_batch_size(global_batch), input_context)

    return strategy.distribute_datasets_from_function(dataset_fn, options=input_options(tf, runtime_kind))


def _train_with_fit(ctx, tf, keras, strategy, model, recipe, params, plan, splits, reporter) -> bool:
    """Keras ``model.fit`` on the distributed training set; validation by the shared Evaluator."""
    with strategy.scope():
        model.compile(
            optimizer=make_optimizer(params["optimizer"], params["learning_rate"], params["precision"]),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=recipe.from_logits),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            steps_per_execution=plan.steps_per_execution,
        )
    if plan.steps_per_execution > 1 and ctx.runtime.kind != "TPU":
        model.train_function = _multi_step_train_function(tf, model, strategy, plan.steps_per_execution)
    if ctx.runtime.kind == "CPU":
        train = distribute(tf, strategy, ctx.runtime.kind, lambda batch_size, input_context: data.training_pipeline(
            splits.train, batch_size, params["seed"], input_context=input_context), plan.global_batch)
    else:
        # Keras distributes the global batches itself, as on any TPU or GPU.
        train = data.training_pipeline(splits.train, plan.global_batch, params["seed"])
    evaluate = _evaluator(ctx, tf, keras, strategy, model, recipe, plan, splits, reporter.stage)
    callbacks = [_reporting_callback(keras, ctx, reporter, evaluate)]
    early_stopping = None
    if params["early_stopping_patience"]:
        early_stopping = keras.callbacks.EarlyStopping(
            monitor="val_loss", patience=params["early_stopping_patience"], mode="min", restore_best_weights=True,
        )
        callbacks.append(early_stopping)
    model.fit(train, epochs=plan.epochs, steps_per_epoch=plan.steps_per_epoch, callbacks=callbacks, verbose=0,
              shuffle=False)
    stopped_early = bool(early_stopping is not None and early_stopping.stopped_epoch > 0 and not ctx.cancelled())
    if stopped_early:
        ctx.log(early_stopping_text(early_stopping.stopped_epoch + 1, params["early_stopping_patience"],
                                    early_stopping.best, early_stopping.best_weights is not None))
    if not ctx.cancelled():
        results = evaluate("test")
        if results is not None:
            reporter.report_test(results)
    return stopped_early


def input_options(tf, runtime_kind: str):
    """How datasets are distributed on CPU replicas: one host pipeline per replica.

    The default feeds replicas through a multi-device iterator, which gives
    every device an iterator of its own with tf.data's tuning thread
    switched on; deleting it waits for those threads to wake, up to a
    minute each (40 to 220 s measured here with TF 2.21 on 8 CPU replicas),
    at every Keras validation and every run's end. Per-replica pipelines
    read on the host (``PER_REPLICA``, no fetch to device) are plain
    iterators over our own pipelines (tuning thread off, see
    jobs.datasets.without_tuning_thread), made and dropped in milliseconds,
    and trained ~40% faster here. On a GPU or TPU the default, which
    prefetches onto the device, stays.
    """
    if runtime_kind != "CPU":
        return None
    return tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
        experimental_fetch_to_device=False,
    )


def early_stopping_text(epoch: int, patience: int, best_loss: float, restored: bool) -> str:
    kept = (f"the weights of the best val_loss {best_loss:.4f} are restored" if restored
            else "val_loss never improved, the last weights are kept")
    return f"early stopping after epoch {epoch}: val_loss did not improve for {patience} epochs; {kept}"


def _multi_step_train_function(tf, model, strategy, steps: int):
    """A multi-step train function for ``fit`` off a TPU.

    Keras 3's own one (an Optional-guarded tf.cond around each step) fails
    under MirroredStrategy with "You must feed a value for placeholder tensor"
    (keras-team/keras#19246). This is the tf-keras loop it replaced: ``steps``
    ``strategy.run`` calls in a ``tf.range`` loop. The training dataset is
    endless and epochs are whole executions, so no step needs the guard.
    """

    def mean_over_replicas(value):
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)

    @tf.function(reduce_retracing=True)
    def train_function(iterator):
        for _ in tf.range(steps - 1):
            strategy.run(model.train_step, args=(next(iterator),))
        outputs = strategy.run(model.train_step, args=(next(iterator),))
        return tf.nest.map_structure(mean_over_replicas, outputs)

    return train_function


def _reporting_callback(keras, ctx, reporter, evaluate: Evaluator):
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


def _train_with_custom_loop(ctx, tf, keras, strategy, model, recipe, params, plan, splits, reporter) -> bool:
    """The \"Use TPUs\" guide's custom training loop, with validation, early stopping and cancel."""
    precision = params["precision"]
    with strategy.scope():
        optimizer = make_optimizer(params["optimizer"], params["learning_rate"], precision)
        loss_function = keras.losses.SparseCategoricalCrossentropy(from_logits=recipe.from_logits, reduction="none")
        train_loss = keras.metrics.Mean(name="loss")
        train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        # Slot variables made inside the first tf.function call would wrap
        # it in an initialisation tf.cond, which MirroredStrategy's
        # cross-replica merge cannot run in.
        optimizer.build(model.trainable_variables)
    global_batch = plan.global_batch
    seed = params["seed"]

    def train_dataset(batch_size, input_context):
        return data.training_pipeline(splits.train, batch_size, seed, input_context=input_context)

    train_distributed = distribute(tf, strategy, ctx.runtime.kind, train_dataset, global_batch)
    scale_loss = precision == "mixed_float16"

    def step_fn(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            outputs = model(images, training=True)
            per_example = loss_function(labels, outputs)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            scaled = optimizer.scale_loss(loss) if scale_loss else loss
        gradients = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        train_loss.update_state(loss * strategy.num_replicas_in_sync)
        train_accuracy.update_state(labels, outputs)

    @tf.function
    def train_steps(iterator, steps):
        for _ in tf.range(steps):
            strategy.run(step_fn, args=(next(iterator),))

    evaluate = _evaluator(ctx, tf, keras, strategy, model, recipe, plan, splits, reporter.stage)
    patience = params["early_stopping_patience"]
    best_loss, best_weights, waited = math.inf, None, 0
    stopped_early = False
    iterator = iter(train_distributed)
    for epoch in range(1, plan.epochs + 1):
        train_loss.reset_state()
        train_accuracy.reset_state()
        reporter.begin_epoch(epoch)
        done = 0
        while done < plan.steps_per_epoch and not ctx.cancelled():
            steps = min(plan.steps_per_execution, plan.steps_per_epoch - done)
            reporter.before_execution(steps)
            train_steps(iterator, tf.constant(steps))
            done += steps
            reporter.after_execution(done, float(train_loss.result()), float(train_accuracy.result()))
        if ctx.cancelled():
            return False
        reporter.end_training_part()
        val = evaluate("val")
        if val is None:
            return False
        reporter.end_epoch({"loss": float(train_loss.result()), "accuracy": float(train_accuracy.result())}, val)
        if patience:
            # Keras EarlyStopping's rule: improvement is a lower val_loss (a
            # NaN never improves), and the first epoch never stops a run.
            if val["loss"] < best_loss:
                best_loss, best_weights, waited = val["loss"], model.get_weights(), 0
            else:
                waited += 1
                if waited >= patience and epoch > 1:
                    stopped_early = True
                    if best_weights is not None:
                        model.set_weights(best_weights)
                    ctx.log(early_stopping_text(epoch, patience, best_loss, best_weights is not None))
                    break
    results = evaluate("test")
    if results is not None:
        reporter.report_test(results)
    return stopped_early


SPECS = (
    JobSpec(
        name="train",
        title="Train an image classifier",
        description=(
            "MNIST, Fashion-MNIST or CIFAR-10 (tfds, or a synthetic set of the same shapes) on every replica, "
            "with Keras fit or the custom loop of TensorFlow's \"Use TPUs\" guide; live loss, accuracy, "
            "examples/s, TensorBoard, profiler."
        ),
        params=PARAMS,
        run=run_train,
        key="t",
        check_runtime=check_runtime,
    ),
)
