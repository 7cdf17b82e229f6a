"""The train job's plan: batch sizes, steps and epochs from its params and the runtime, and its settings.

``TrainingPlan`` turns params and a runtime into what the loops do (global
batch, steps per epoch, executions); ``tpu_advice`` is the Cloud TPU
performance guide's advice on those sizes; the precision policy, op
determinism and the optimizer are set up here and restored by the caller.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs import datasets as data
from jobs.events import Artifact

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")


OPTIMIZERS = ("adam", "sgd", "rmsprop", "adamw")


# auto: Keras fit, or the custom loop where fit cannot train (a cluster of workers).
LOOPS = ("auto", "fit", "custom")


TPU_MXU = 128


TPU_PADDING = 8


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


def check_profile_steps(value: str) -> str | None:
    try:
        parse_profile_steps(value)
    except ValueError as error:
        return f"{error}; allowed: empty (no profiling), N, or N-M with 1 <= N <= M (global steps), e.g. 5-10"
    return None


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
            'TensorFlow\'s "Use TPUs" guide measured ~2× faster steps with steps_per_execution=50'
        )
    if precision == "float32":
        advice.append(
            "precision float32 on a TPU: mixed_bfloat16 uses the bfloat16 matrix units "
            "(TensorFlow's mixed precision guide)"
        )
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
    def make(
        cls, params: dict, replicas: int, train_examples: int, test_examples: int, drop_partial_test_batch: bool = False
    ) -> TrainingPlan:
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
        return cls(
            replicas,
            params["batch_per_replica"],
            global_batch,
            train_examples,
            test_examples,
            steps,
            per_execution,
            params["epochs"],
            drop_partial_test_batch,
            evaluation_steps,
        )


class ProfileWindow:
    """Profiles global steps ``first``–``last`` (both included), and with a ``profiler`` whatever is asked for live.

    Without a profiler (a job run outside tpudash's runner) it starts the framework's profiler
    before ``first`` and stops it after ``last``, into ``logdir``. With one (``JobContext.profiler``,
    tpudash's ``ProfileResponder``) the window is the profiler's ``schedule``, and every execution
    goes through its step hooks and inside its step marker, so XProf sees steps; the profiler
    answers the requests of ``tpudash profile`` and the dashboard, into ``<run>/profile``.
    """

    def __init__(
        self, ctx: Any, steps: tuple[int, int] | None, logdir: Path, profiler: Any = None, framework: str = "tensorflow"
    ):
        """``framework``: whose profiler traces without a ``profiler`` (TensorFlow's, or ``jax.profiler``)."""
        self.ctx = ctx
        self.framework = framework
        self.first, self.last = steps or (0, 0)
        self.logdir = logdir
        self.state = "waiting" if steps else "done"  # waiting → tracing → done
        self.trace_dir: Path | None = None
        self.trace_bytes = 0
        self.profiler = profiler
        # The step marker of the execution under way: entered before it, left after it.
        self._marker: Any = None
        if profiler is not None and steps:
            profiler.schedule(self.first, self.last)

    def _step_of(self, first_step: int, last_step: int) -> int:
        """The step an execution of ``first_step``–``last_step`` begins the scheduled window with, if it does."""
        return self.first if self.first and first_step < self.first <= last_step else first_step

    def before(self, first_step: int, last_step: int) -> None:
        if self.profiler is not None:
            self._leave_marker()
            self.profiler.step_begin(self._step_of(first_step, last_step))
            marker = self.profiler.marker(first_step)
            marker.__enter__()
            self._marker = marker
            return
        if self.state != "waiting" or last_step < self.first:
            return
        try:
            trace_start(self.framework, str(self.logdir))
        except Exception as error:  # noqa: BLE001 - profiling is an extra; training goes on
            self.state = "done"
            self.ctx.log(f"profiler did not start ({type(error).__name__}: {error}); training continues", "warning")
            return
        self.state = "tracing"
        self.ctx.log(f"profiler tracing from step {first_step} to step {self.last}")

    def after(self, step_done: int) -> None:
        if self.profiler is not None:
            self._leave_marker()
            self.profiler.step_end(step_done)
            return
        if self.state == "tracing" and step_done >= self.last:
            self.stop()

    def stop(self) -> None:
        if self.state != "tracing":
            return
        self.state = "done"
        try:
            trace_stop(self.framework)
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

    def _leave_marker(self) -> None:
        marker, self._marker = self._marker, None
        if marker is not None:
            marker.__exit__(None, None, None)

    def finish(self, last_step: int) -> None:
        """Stop a trace cut short by the end of the run; say when the range was never reached.

        With a profiler only the last step marker is left: the runner closes the profiler,
        which answers what is still pending (a window never reached, a capture cut short).
        """
        if self.profiler is not None:
            self._leave_marker()
            if self.state == "waiting" and last_step < self.first:
                self.state = "done"
                self.ctx.log(
                    f"profile_steps {self.first}-{self.last} was never reached (the run ended at step {last_step}): "
                    f"no trace",
                    "warning",
                )
            return
        if self.state == "tracing":
            self.stop()
        elif self.state == "waiting":
            self.state = "done"
            self.ctx.log(
                f"profile_steps {self.first}-{self.last} was never reached (the run ended at step {last_step}): "
                f"no trace",
                "warning",
            )


def trace_start(framework: str, logdir: str) -> None:
    """Start the framework's profiler into ``logdir`` (both write ``plugins/profile/<run>/*.xplane.pb`` there)."""
    if framework == "jax":
        import jax

        jax.profiler.start_trace(logdir)
    else:
        import tensorflow as tf

        tf.profiler.experimental.start(logdir)


def trace_stop(framework: str) -> None:
    if framework == "jax":
        import jax

        jax.profiler.stop_trace()
    else:
        import tensorflow as tf

        tf.profiler.experimental.stop()


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


def distribute(tf, strategy, runtime_kind: str, make, global_batch: int):
    """``make(per_replica_batch, input_context)`` distributed over the replicas.

    Off a TPU or GPU (see input_options) every replica gets its own host
    pipeline over its shard of the data. Across workers
    (MultiWorkerMirroredStrategy) each worker's pipeline reads its own
    shard, with the strategy's default options.
    """

    def dataset_fn(input_context):
        return make(input_context.get_per_replica_batch_size(global_batch), input_context)

    across_workers = bool(getattr(getattr(strategy, "extended", None), "_cluster_spec", None))
    options = None if across_workers else input_options(tf, runtime_kind)
    return strategy.distribute_datasets_from_function(dataset_fn, options=options)


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
