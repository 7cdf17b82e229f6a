"""The ``train`` job: an image classifier trained on every replica, reported live.

MNIST, Fashion-MNIST or CIFAR-10 through tfds (or a synthetic set of the same
shapes, jobs.datasets), one of the models in jobs.models built under
``strategy.scope()``, trained either by Keras ``fit`` or by the custom loop of
TensorFlow's "Use TPUs" guide (``distribute_datasets_from_function``, per-replica batches,
``tf.nn.compute_average_loss``, ``steps_per_execution`` steps per
``tf.function`` call through ``tf.range``).

The job is split by what each part does: ``jobs.trainplan`` (sizes, steps,
precision, the per-replica datasets), ``jobs.trainreport`` (stages, metrics,
validation) and ``jobs.trainloops`` (Keras ``fit`` and the custom loop); this
module declares the params and runs the plan.

One run, two frameworks: ``run_training`` is the run (data, plan, model,
reports, profile window, advice, summary) and takes the framework's side,
``TensorFlowTraining`` here (the runtime's tf.distribute strategy) or
``jobs.on_jax.train.JaxTraining`` (the same Keras model and ``fit`` under
``keras.distribution.DataParallel`` over the JAX mesh, NumPy input, no
TensorFlow), so both emit the same events and summary keys.

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

On many workers (``workers`` > 1: MultiWorkerMirroredStrategy, one process
per worker with its TF_CONFIG, started by the launcher) every worker runs this
job with the custom loop on its own shard, and all report the same all-reduced
losses; only the chief writes TensorBoard scalars; a peer lost mid-run fails
the job with ``WorkerLost`` naming it (jobs.trainworkers says why not ``fit``).
The job refuses ``workers`` > 1 in a process that is not in such a cluster.

Off a TPU, ``fit`` with ``steps_per_execution`` > 1 runs its executions with
the tf-keras loop (see jobs.trainloops.multi_step_train_function): Keras 3's own fails under
MirroredStrategy.

Cancel is checked after every execution (and every evaluation batch, and
every chunk of the data being made or loaded): the run ends within one
execution. The global mixed precision policy and op
determinism are restored when the run ends, however it ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobs import datasets as data
from jobs.base import JobSpec, Param, ParamError
from jobs.events import Artifact, Progress, StageAnnouncer
from jobs.models import MODEL_NAMES, MODELS, build_model, parameter_count, summary_table
from jobs.trainloops import train_with_custom_loop, train_with_fit
from jobs.trainplan import (
    LOOPS,
    OPTIMIZERS,
    PRECISIONS,
    ProfileWindow,
    TrainingPlan,
    check_profile_steps,
    op_determinism,
    parse_profile_steps,
    precision_policy,
    tpu_advice,
)
from jobs.trainreport import STAGE_MODEL, TrainingReporter, data_stage_name
from jobs.trainworkers import WorkerLost, check_workers, cluster_of, is_peer_loss, lost_worker_message, training_loop

PARAMS = (
    Param("dataset", "str", "mnist", "images to classify", choices=data.DATASET_NAMES),
    Param(
        "source",
        "str",
        "tfds",
        "tfds: the real data (data dir, download); synthetic: a learnable stand-in of the same shapes, no files needed",
        choices=data.SOURCES,
    ),
    Param(
        "model",
        "str",
        "light",
        "light: small CPU-friendly CNN; mnist-cnn: the MNIST CNN of TensorFlow's "
        '"Use TPUs" guide; cifar-cnn: the Colab TPU walkthrough\'s CIFAR-10 CNN (225,034 params)',
        choices=MODEL_NAMES,
    ),
    Param("epochs", "int", 5, "passes over the training split", minimum=1, maximum=100_000),
    Param(
        "batch_per_replica",
        "int",
        64,
        "examples per replica per step; global batch = this × replicas",
        minimum=1,
        maximum=1 << 20,
    ),
    Param("learning_rate", "float", 0.001, "optimizer step size", minimum=0.0, maximum=10.0, minimum_exclusive=True),
    Param("optimizer", "str", "adam", "optimizer", choices=OPTIMIZERS),
    Param(
        "precision", "str", "float32", "Keras dtype policy; the output layer always stays float32", choices=PRECISIONS
    ),
    Param(
        "steps_per_execution",
        "int",
        1,
        'training steps per tf.function call (the "Use TPUs" guide uses 50)',
        minimum=1,
        maximum=100_000,
    ),
    Param(
        "loop",
        "str",
        "auto",
        'fit: Keras model.fit; custom: the "Use TPUs" guide\'s custom training loop; auto: fit, '
        "or custom on several workers (where Keras 3's fit fails)",
        choices=LOOPS,
    ),
    Param(
        "early_stopping_patience",
        "int",
        0,
        "stop after this many epochs without a better val_loss (0 = off)",
        minimum=0,
        maximum=100_000,
    ),
    Param(
        "deterministic",
        "bool",
        False,
        "op determinism (tf.config.experimental.enable_op_determinism) so a rerun gives identical losses",
    ),
    Param("seed", "int", 42, "seed for weights, shuffling and the synthetic data", minimum=0, maximum=2**31 - 1),
    Param("limit_train", "int", 0, "use only the first N training examples (0 = all)", minimum=0, maximum=10_000_000),
    Param("limit_test", "int", 0, "use only the first N test examples (0 = all)", minimum=0, maximum=10_000_000),
    Param(
        "profile_steps",
        "str",
        "",
        "capture a profiler trace of these global steps, e.g. 5-10 (empty = off); run by tpudash, into "
        "<run>/profile, where tpudash profile RUN --list finds it",
        check=check_profile_steps,
    ),
    Param(
        "workers",
        "int",
        1,
        "worker processes on this machine under MultiWorkerMirroredStrategy (TF_CONFIG on loopback ports)",
        minimum=1,
        maximum=64,
    ),
)


def check_runtime(params: dict, runtime: Any) -> None:
    """Rules that need the replica count: a limit must hold at least one global batch; workers match the cluster."""
    if cluster_of(runtime) is not None:
        check_workers(params, runtime)
    global_batch = params["batch_per_replica"] * int(runtime.num_replicas)
    limit = params["limit_train"]
    if limit and limit < global_batch:
        raise ParamError(
            "limit_train",
            f"{limit} is fewer than one global batch ({params['batch_per_replica']} per replica × "
            f"{runtime.num_replicas} replicas = {global_batch}); allowed: 0 (all) or >= {global_batch}",
        )


class TensorFlowTraining:
    """The train job's TensorFlow side: the runtime's tf.distribute strategy, tf.data, Keras ``fit`` or the
    custom loop, TensorBoard scalars, op determinism (``run_training`` drives it; ``on_jax.train`` is JAX's)."""

    framework = "tensorflow"
    tf_data = True

    def __init__(self, ctx: Any, params: dict):
        import keras
        import tensorflow as tf

        self.tf, self.keras = tf, keras
        check_workers(params, ctx.runtime)
        self.ctx = ctx
        self.cluster = cluster_of(ctx.runtime)
        self.strategy = ctx.runtime.strategy
        self.replicas = int(self.strategy.num_replicas_in_sync)
        self.loop, self.loop_warning = training_loop(params["loop"], self.cluster)
        # TensorFlow's rule: only the chief writes summaries (another worker's would duplicate them).
        self.writes_summaries = self.cluster is None or self.cluster.get("worker") == 0

    def source(self, params: dict) -> str:
        return params["source"]

    def scalars(self, tensorboard_dir: Path) -> Any:
        return None  # TensorFlow's own tf.summary writers

    def determinism(self, enabled: bool):
        return op_determinism(enabled)

    def build_scope(self):
        return self.strategy.scope()

    def advice_inputs(self, splits: data.Splits, plan: TrainingPlan, seed: int) -> dict:
        # The pipeline each replica's input is made by (distributing it wraps the same stages).
        return {"dataset": data.training_pipeline(splits.train, plan.global_batch, seed)}

    def train(self, model, recipe, params: dict, plan: TrainingPlan, splits: data.Splits, reporter) -> bool:
        loop = train_with_fit if self.loop == "fit" else train_with_custom_loop
        try:
            return loop(self.ctx, self.tf, self.keras, self.strategy, model, recipe, params, plan, splits, reporter)
        except Exception as error:
            if self.cluster is not None and is_peer_loss(error):
                raise WorkerLost(lost_worker_message(error, self.cluster)) from error
            raise


def run_train(ctx: Any, params: dict) -> dict:
    return run_training(ctx, params, TensorFlowTraining(ctx, params))


def run_training(ctx: Any, params: dict, framework: Any) -> dict:
    """The train job on either framework: data, plan, model, reports, advice and summary, one way.

    ``framework`` is its side (``TensorFlowTraining``, ``jobs.on_jax.train.JaxTraining``): ``replicas``,
    ``cluster``, ``loop``/``loop_warning``, ``writes_summaries``, ``scalars``, ``tf_data``, ``source``,
    ``determinism``, ``build_scope``, ``advice_inputs`` and ``train``.
    """
    import keras

    runtime = ctx.runtime
    cluster = framework.cluster
    replicas = framework.replicas
    loop = framework.loop
    settings = ctx.settings
    with framework.determinism(params["deterministic"]), precision_policy(params["precision"]):
        keras.utils.set_random_seed(params["seed"])
        stage = StageAnnouncer(ctx.emit)
        shape = data.DATASETS[params["dataset"]]
        source = framework.source(params)
        data_stage = data_stage_name(params["dataset"], source)

        def data_made(done: int, total: int) -> None:
            ctx.raise_if_cancelled()
            stage(data_stage, done, total)

        if framework.loop_warning is not None:
            ctx.log(framework.loop_warning, "warning")
        stage(data_stage)
        splits = data.load_splits(
            shape.name,
            source,
            data_dir=getattr(settings, "data_dir", None),
            try_gcs=runtime.kind == "TPU",
            limit_train=params["limit_train"],
            limit_test=params["limit_test"],
            seed=params["seed"],
            log=ctx.log,
            progress=data_made,
            advise_param=ctx.advise_param,
            tf_data=framework.tf_data,
        )
        ctx.raise_if_cancelled()
        # On a TPU every batch needs the same shape; elsewhere the last
        # partial test batch is evaluated too.
        plan = TrainingPlan.make(
            params, replicas, splits.train_examples, splits.test_examples, drop_partial_test_batch=runtime.kind == "TPU"
        )
        if plan.drop_partial_test_batch and plan.test_examples % plan.global_batch:
            ctx.log(
                f"the last {plan.test_examples % plan.global_batch} test examples are left out: "
                f"a TPU needs full batches",
                "warning",
            )
        for advice in tpu_advice(
            runtime.kind, plan.per_replica_batch, replicas, params["steps_per_execution"], params["precision"]
        ):
            ctx.log(advice, "warning")
        if plan.steps_per_execution != params["steps_per_execution"]:
            ctx.log(f"steps_per_execution lowered to {plan.steps_per_execution}, the steps in one epoch", "warning")

        recipe = MODELS[params["model"]]
        stage(STAGE_MODEL)
        with framework.build_scope():
            model = build_model(params["model"], splits.shape.image_shape, splits.shape.num_classes)
        params_count = parameter_count(model)
        ctx.emit(summary_table(model, f"model {params['model']} on {splits.label}: {params_count:,} params"))
        ctx.log(
            f"training {params['model']} ({params_count:,} params) on {splits.label}: "
            f"{splits.train_examples:,} train / {splits.test_examples:,} test examples; "
            f"global batch {plan.global_batch} = {plan.per_replica_batch} per replica × {replicas} replicas "
            f"({runtime.kind}{workers_text(cluster)}); {plan.steps_per_epoch} steps per epoch, {loop} loop, "
            f"steps_per_execution {plan.steps_per_execution}, precision {params['precision']}"
        )
        tensorboard_dir = Path(ctx.run_dir) / "tensorboard"
        writes_summaries = framework.writes_summaries
        if writes_summaries:
            tensorboard_dir.mkdir(parents=True, exist_ok=True)
            ctx.emit(Artifact(kind="tensorboard", path=str(tensorboard_dir)))
        is_chief = cluster is None or cluster.get("worker") == 0
        profile_range = parse_profile_steps(params["profile_steps"])
        profiler = getattr(ctx, "profiler", None)
        profile = None
        if profiler is not None:
            # tpudash's runner: every worker answers the profile requests for it, and profile_steps is scheduled.
            profile = ProfileWindow(ctx, profile_range, tensorboard_dir, profiler, framework=framework.framework)
        elif profile_range and is_chief:
            profile = ProfileWindow(ctx, profile_range, tensorboard_dir, framework=framework.framework)
        reporter = TrainingReporter(
            ctx,
            plan,
            tensorboard_dir if writes_summaries else None,
            profile,
            stage,
            scalars=framework.scalars(tensorboard_dir) if writes_summaries else None,
        )
        advisor = getattr(ctx, "advisor", None) if is_chief else None  # one advice.json per run: the chief's
        if advisor is not None:
            inputs = framework.advice_inputs(splits, plan, params["seed"])
            advisor.start(model=model, global_batch=plan.global_batch, **inputs)
        ctx.emit(Progress(done=0, total=plan.epochs, unit="epoch"))
        try:
            stopped_early = framework.train(model, recipe, params, plan, splits, reporter)
        finally:
            if profile is not None:
                profile.finish(reporter.global_step)
            reporter.close()
            if advisor is not None:
                advisor.close()  # JAX's compile listener is process-wide: stopped however the run ends

    summary = {
        "data": splits.label,
        "dataset": params["dataset"],
        "source": splits.source,
        "synthetic": splits.source == "synthetic",
        "model": params["model"],
        "params": params_count,
        "loop": loop,
        "workers": cluster["workers"] if cluster is not None else 1,
        "precision": params["precision"],
        "replicas": replicas,
        "global_batch": plan.global_batch,
        "steps_per_epoch": plan.steps_per_epoch,
        "steps_per_execution": plan.steps_per_execution,
        "epochs_run": reporter.epochs_done,
        "steps": reporter.global_step,
        "examples_per_second": reporter.examples_per_second(),
        "early_stopped": stopped_early,
        "tensorboard": str(tensorboard_dir) if writes_summaries else None,
        "profile": str(profile.trace_dir) if profile is not None and profile.trace_dir else None,
    }
    if advisor is not None:
        summary.update(advisor.finish())
    summary.update({name: value for name, value in reporter.last_train.items()})
    summary.update({f"val_{name}": value for name, value in reporter.last_val.items()})
    summary.update({f"test_{name}": value for name, value in reporter.test.items()})
    if ctx.cancelled():
        ctx.log(f"cancelled after {reporter.global_step} steps (epoch {reporter.epoch})", "warning")
    return summary


def workers_text(cluster: dict | None) -> str:
    """`` on 2 workers, this is worker 0`` in a cluster; empty alone."""
    if cluster is None:
        return ""
    return f" on {cluster['workers']} workers, this is worker {cluster['worker']}"


SPECS = (
    JobSpec(
        name="train",
        title="Train an image classifier",
        description=(
            "MNIST, Fashion-MNIST or CIFAR-10 (tfds, or a synthetic set of the same shapes) on every replica, "
            'with Keras fit or the custom loop of TensorFlow\'s "Use TPUs" guide; live loss, accuracy, '
            "examples/s, TensorBoard, profiler."
        ),
        params=PARAMS,
        run=run_train,
        run_jax="jobs.on_jax.train:run_train_jax",
        key="t",
        check_runtime=check_runtime,
        name_params=("dataset", "model"),
        profiles_steps=True,
    ),
)
