"""TpudashCallback: the user's own ``model.fit`` writes a run the dashboard watches.

On a TPU host only one process may hold the chips, so the user's notebook or
script trains and tpudash watches::

    from tpudash.callbacks import TpudashCallback
    model.fit(train, epochs=10, validation_data=val, callbacks=[TpudashCallback()])

The run lands in tpudash's runs directory in the format jobs write (through
``tpudash.recording.RecordedRun``): run_started with the model (name,
parameters, optimizer, summary table), the strategy, replicas and versions;
per-batch train metrics, decimated (at most ten points a second unless
``every_n_batches`` says otherwise); per-epoch train and validation metrics,
examples/s (steps/s when the batch size is not known) and progress; then
done, failed with the traceback, or cancelled on KeyboardInterrupt.

Keras calls no callback when ``fit`` raises, so the callback guards the
model's train and test functions: an exception inside a step (a data
error, out of memory, Ctrl-C) ends the run with its traceback and is raised
on unchanged. One raised elsewhere in ``fit`` is recorded at the next
``fit`` or when the process exits. Imports neither textual nor screens.

Any Keras backend. On TensorFlow Keras calls every batch's end on the
training thread. On JAX (and torch) it hands them to a thread pool when
every callback says it is ``async_safe``: this one does by default (a lock
guards its state; batch ends may arrive concurrently and out of order, and
a batch point older than the last recorded is dropped, as the decimation
would drop it), so the training thread never waits for a step's logs to
reach the host. ``every_n_batches=N`` asks for every N-th batch exactly:
then Keras calls each batch end in order on the training thread, and pays a
host sync per batch for it. Under a Keras distribution
over several devices (``keras.distribution.DataParallel``,
``ModelParallel``) each epoch's end also records the largest trainable
variable's norm per device, one value per shard: equal across devices when
the replicas agree (DataParallel), one slice each when it is sharded.

On a cluster (``MultiWorkerMirroredStrategy`` with ``TF_CONFIG``; Keras on
JAX with a process per host) every worker runs the same script and records
into one run: the chief creates it, the others join it with their own
progress, step times and heartbeat (``tpudash.recording``). The run's id is
then required, the same on every worker::

    TpudashCallback(run_id="mnist-mwms-0601")   # or TPUDASH_RUN_ID set for every worker

A second ``fit`` with the same callback records ``<run_id>-fit2``, and so on,
on every worker alike.

Profiles. The run answers the dashboard's profile requests
(``tpudash.profiles.capture``, the run's ``RecordedRun.profiler``): every call
of the train function runs inside the framework's step marker (TensorFlow's
``Trace``, JAX's ``StepTraceAnnotation`` under Keras on JAX), numbered by the
global step across epochs; a profile asked for starts at the next batch's
begin and stops, on the training thread, after the steps asked for.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import keras

from jobs.batchmeans import BatchMeans
from jobs.events import split_final_name, to_jsonable
from tpudash.advice.fitadvice import fit_peak, start_fit_advice
from tpudash.advice.live import RunAdvisor, peak_json
from tpudash.fitinfo import adapter_batch_size, running_fit_adapter
from tpudash.profiles.capture import ProfileResponder
from tpudash.recording import (
    RecordedRun,
    RecordingError,
    find_recording_worker,
    runs_directory,
    session_runtime,
    shared_run_id,
)
from tpudash.runs.layout import SOURCE_CALLBACK
from tpudash.runs.workers import WorkerIdentity

# Without ``every_n_batches``, a batch point at most this often: what the
# dashboard can show, at a cost training does not notice.
MIN_SECONDS_BETWEEN_BATCH_POINTS = 0.1
# Exceptions Keras raises through the train function on purpose: the end of a dataset.
END_OF_DATA = ("StopIteration", "OutOfRangeError")
# Per-device values once an epoch come from this backend's sharded arrays.
SHARDED_BACKEND = "jax"
# When a step raises, how long the run's end waits for batch ends still on Keras' pool (a step's logs
# are on the host within milliseconds): the points just before a failure are what a user looks at first.
PENDING_BATCH_ENDS_SECONDS = 2.0


class TpudashCallback(keras.callbacks.Callback):
    """Records ``model.fit`` as a tpudash run; see the module docstring.

    ``name``: what the run is called (default: the model's name).
    ``runs_dir``: where: a directory or a store URL (``gs://BUCKET/runs``, ``s3://…``); default tpudash's runs
    directory, ``$TPUDASH_RUNS_DIR``. In a store, ``fit`` never waits for the network (``tpudash.runs.uploader``).
    One that cannot be recorded into (empty, a malformed URL, a store whose library is missing) raises
    ``RecordingError`` (a ``ValueError``) here, naming it.
    ``every_n_batches``: a batch point every N batches (default: at most ten a second).
    ``batch_size``: the global batch, for examples/s (default: read from ``fit`` when Keras knows it).
    ``worker``: which worker of a cluster this process is (a number, or a ``WorkerIdentity``); default:
    found from TF_CONFIG, the model's distribute strategy or JAX (``tpudash.runs.workers.find_worker``).
    ``run_id``: the run every worker records into (required with several workers, unless ``$TPUDASH_RUN_ID``).
    ``advice``: judge the run against the TPU performance checklist and measure its MFU (``tpudash.advice``;
    the chief's advice.json, the run view's Advice tab, ``tpudash advise``); False: neither.
    """

    def __init__(
        self,
        name: str | None = None,
        runs_dir: str | os.PathLike | None = None,
        every_n_batches: int | None = None,
        batch_size: int | None = None,
        *,
        worker: int | WorkerIdentity | None = None,
        run_id: str | None = None,
        advice: bool = True,
    ):
        super().__init__()
        for field, value in (("every_n_batches", every_n_batches), ("batch_size", batch_size)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise RecordingError(f"{field}: {value!r} is not allowed; allowed: a whole number ≥ 1, or None")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise RecordingError(
                f"name: {name!r} is not allowed; allowed: a non-empty text, or None for the model's name"
            )
        if runs_dir is not None:
            # A runs_dir that cannot be recorded into is the caller's mistake: said here, as Keras says a bad
            # argument, not as a warning lost in fit's output while the training records nothing.
            if not isinstance(runs_dir, (str, os.PathLike)):
                from tpudash.runs.location import ALLOWED

                raise RecordingError(
                    f"runs_dir: {runs_dir!r} is not allowed; allowed: {ALLOWED}, or None for tpudash's runs directory"
                )
            runs_directory(runs_dir)
        # Before training starts: a cluster without a shared run id, or a malformed TF_CONFIG, is said now.
        shared_run_id(run_id, find_recording_worker(worker))
        self.worker = worker
        self.run_id = run_id
        self._fits = 0
        self.name = name
        self.runs_dir = runs_dir
        self.every_n_batches = every_n_batches
        self.batch_size = batch_size
        self.run: RecordedRun | None = None
        """The run of the current (or last) ``fit``."""
        self._batch_means = BatchMeans()
        self._mean_metrics: set[str] | None = None
        self._steps_before_epoch = 0
        self._steps_in_epoch = 0
        self._epoch = 0
        self._epoch_started = 0.0
        self._train_seconds: float | None = None
        self._last_point = 0.0
        self._rates: list[float] = []
        self._fit_batch_size: int | None = None
        self._fit_model: Any = None
        self.advice = advice
        self._advisor: RunAdvisor | None = None
        # Keras on a thread-safe backend (JAX, torch) then calls on_train_batch_end on a pool thread, off the
        # training loop (TensorFlow's Keras calls it in-line whatever this says). Exact points every N batches
        # need the batch ends in order: those stay on the training thread.
        self.async_safe = every_n_batches is None
        self._backend = keras.backend.backend()
        # Batch ends may run on Keras' pool threads while the training thread starts an epoch or ends the run.
        self._lock = threading.Condition(threading.Lock())
        self._last_batch_ended = 0.0
        self._batches_begun = self._batches_ended = 0  # calls in this fit, to wait for those still on the pool
        self._step = 0  # the global step (across epochs, from 1) the training thread began last: the marker's
        self._training_thread = 0

    # -- fit begins and ends -----------------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.run is not None and not self.run.finished:
            self.run.finish(
                "failed",
                error="fit raised outside a training step (another callback, or between steps); "
                "the error went to the caller",
            )
        # Read once here: under JAX, ``self.model`` copies the training state back into the model on every
        # access, which on Keras' pool threads would race the training loop for buffers it donates.
        self._fit_model = model = self.model
        adapter = running_fit_adapter()
        self._fit_batch_size = self.batch_size or adapter_batch_size(adapter)
        params, layers = _describe_model(model, self.params or {}, self._fit_batch_size)
        strategy = getattr(model, "distribute_strategy", None)  # TensorFlow's; JAX's Keras has its distribution
        distribution = _keras_distribution() if self._backend == SHARDED_BACKEND else None
        runtime = session_runtime(distribution or strategy, backend=self._backend)
        runtime["model_summary"] = layers
        peak = fit_peak(runs_directory(self.runs_dir), runtime) if self.advice else None
        if peak is not None:
            runtime["mfu_peak"] = peak_json(peak)
        self._fits += 1
        try:
            self.run = RecordedRun(
                self.name or model.name,
                params,
                runs_dir=self.runs_dir,
                runtime=runtime,
                source=SOURCE_CALLBACK,
                worker=find_recording_worker(self.worker, strategy),
                run_id=self._fit_run_id(),
            )
        except RecordingError as error:
            # Only the strategy told that there are several workers (no TF_CONFIG): no run to share.
            self.run = None
            warnings.warn(f"tpudash: cannot record this fit ({error}); training goes on without a run", stacklevel=2)
            return
        except OSError as error:
            # A full disk or an unwritable runs directory must not stop the user's training.
            self.run = None
            warnings.warn(f"tpudash: cannot record this fit ({error}); training goes on without a run", stacklevel=2)
            return
        self.run.table(f"model {model.name}", ["layer", "type", "output shape", "parameters"], layers)
        self.run.log(
            f"{model.name}: {params['parameters']:,} parameters ({params['trainable_parameters']:,} trainable); "
            f"{_placement(runtime)}"
        )
        self._mean_metrics = None
        self._steps_before_epoch = self._steps_in_epoch = 0
        self._rates = []
        self._batches_begun = self._batches_ended = 0
        self._step, self._training_thread = 0, threading.get_ident()
        self._guard("train_function")
        chief = self.run.worker is None or self.run.worker.is_chief  # one advice.json per run: the chief's
        self._advisor = (
            start_fit_advice(self.run, runtime, peak, model, adapter, self._fit_batch_size)
            if peak is not None and chief
            else None
        )

    def _fit_run_id(self) -> str | None:
        """The shared run id of this ``fit``: as given for the first, ``<id>-fit<n>`` for the n-th."""
        shared = shared_run_id(self.run_id, None)
        if shared is None or self._fits == 1:
            return shared
        return f"{shared}-fit{self._fits}"

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        # Keras has waited for every batch end of the fit by now.
        run = self.run
        self._unguard()
        if run is None or run.finished:
            return
        summary: dict[str, Any] = {"epochs": self._epoch, "steps": self._steps_before_epoch + self._steps_in_epoch}
        summary.update({name: value for name, value in (logs or {}).items() if isinstance(value, (int, float))})
        rate_name = "examples_per_second" if self._fit_batch_size else "steps_per_second"
        steady = self._rates[1:] or self._rates  # the first epoch pays for tracing
        if steady:
            summary[rate_name] = sum(steady) / len(steady)
        if getattr(self._fit_model, "stop_training", False):
            summary["stopped_early"] = True
        if self._advisor is not None:
            summary.update(self._advisor.finish())
        run.finish("done", summary)

    # -- epochs ------------------------------------------------------------------------------
    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        with self._lock:  # the previous epoch's batch ends have all run (Keras waits for them at its end)
            self._epoch = epoch + 1
            self._steps_before_epoch += self._steps_in_epoch
            self._steps_in_epoch = 0
            self._batch_means.reset()
            self._train_seconds = None
            self._epoch_started = self._last_point = self._last_batch_ended = time.perf_counter()

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        # Validation inside fit: the epoch's training part ends here.
        with self._lock:
            if self.run is None or self.run.finished:
                return
            if self._train_seconds is None:
                self._train_seconds = time.perf_counter() - self._epoch_started
        self._steps_ended(self._step)  # validation is no training step: out of a profile
        self._guard("test_function")

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        with self._lock:
            self._record_epoch(logs or {})
        self._steps_ended(self._steps_before_epoch + self._steps_in_epoch)

    def _record_epoch(self, logs: dict[str, Any]) -> None:
        run = self.run
        if run is None or run.finished:
            return
        if self._train_seconds is None:
            seconds = time.perf_counter() - self._epoch_started
        else:
            # With batch ends on a pool, the last steps may have still been running when validation began.
            seconds = max(self._train_seconds, self._last_batch_ended - self._epoch_started)
        step = self._steps_before_epoch + self._steps_in_epoch
        for key, value in logs.items():
            split, name = split_final_name(key)
            if isinstance(value, (int, float)):
                run.metric(name, value, step=step, epoch=self._epoch, split=split)
        if seconds > 0 and self._steps_in_epoch:
            per_step = self._fit_batch_size or 1
            rate = self._steps_in_epoch * per_step / seconds
            self._rates.append(rate)
            run.metric(
                "examples_per_second" if self._fit_batch_size else "steps_per_second",
                rate,
                step=step,
                epoch=self._epoch,
            )
        if self._backend == SHARDED_BACKEND:
            self._record_variable_per_device(run)
        if self._advisor is not None:
            steps_per_second = self._steps_in_epoch / seconds if seconds > 0 and self._steps_in_epoch else None
            mfu = self._advisor.epoch_end(self._epoch, step, steps_per_second).mfu
            if mfu is not None and mfu.mfu is not None:
                run.metric("mfu", mfu.mfu, step=step, epoch=self._epoch)
        run.progress(self._epoch, (self.params or {}).get("epochs"), "epoch")

    def _record_variable_per_device(self, run: RecordedRun) -> None:
        """The largest trainable variable's norm on each device, under a distribution over several devices."""
        distribution = _keras_distribution()
        if distribution is None:
            return
        try:
            # Keras has put the epoch's state back into the model's variables before calling on_epoch_end.
            variable = max(getattr(self._fit_model, "trainable_variables", []), key=_size, default=None)
            shards = variable.value.addressable_shards if variable is not None else []
        except (AttributeError, TypeError):
            return  # not a jax.Array (a backend or Keras that shards differently): nothing per device
        if len(shards) < 2:
            return
        norms = _shard_norms(shards)
        run.replica_values(f"‖{_variable_name(variable, self._fit_model)}‖ per device", norms)

    # -- batches -----------------------------------------------------------------------------
    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Always on the training thread, before the step; its end may come later, on Keras' pool.
        self._batches_begun += 1
        self._step = step = self._steps_before_epoch + batch + 1
        profiler = self._profiler()
        if profiler is not None:
            profiler.step_end(step - 1)  # the step before has ended (its batch end may still be on the pool)
            profiler.step_begin(step)

    def _profiler(self) -> ProfileResponder | None:
        run = self.run
        return run.profiler if run is not None else None

    def _steps_ended(self, step: int) -> None:
        """The profiler's step end, on the training thread only (a profile stops where the training runs)."""
        profiler = self._profiler()
        if profiler is not None and threading.get_ident() == self._training_thread:
            profiler.step_end(step)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._steps_ended(self._steps_before_epoch + batch + 1)  # in-line on TensorFlow; else the next begin's
        with self._lock:
            try:
                self._record_batch(batch, logs or {})
            finally:
                self._batches_ended += 1
                self._lock.notify_all()

    def _record_batch(self, batch: int, logs: dict[str, Any]) -> None:
        run = self.run
        if run is None or run.finished:
            return
        # ``batch`` is the last step of this call in the epoch (several with steps_per_execution).
        steps_done = batch + 1
        if steps_done <= self._steps_in_epoch:
            return  # on Keras' pool a later batch end ran first: its running means already cover this one
        self._steps_in_epoch = steps_done
        self._last_batch_ended = time.perf_counter()
        if self.every_n_batches is not None:
            if steps_done - self._batch_means.steps < self.every_n_batches:
                return
        else:
            now = time.perf_counter()
            if now - self._last_point < MIN_SECONDS_BETWEEN_BATCH_POINTS:
                return
            self._last_point = now
        if self._mean_metrics is None:
            self._mean_metrics = _mean_metric_names(self._fit_model)
        means = {name: value for name, value in logs.items() if name in self._mean_metrics}
        values = self._batch_means.since_last(steps_done, means)
        values.update({name: value for name, value in logs.items() if name not in means})
        step = self._steps_before_epoch + steps_done
        for name, value in values.items():
            if isinstance(value, (int, float)):
                run.metric(f"batch_{name}", value, step=step, epoch=self._epoch)
        run.progress(steps_done, (self.params or {}).get("steps"), "step")

    # -- failures inside fit -----------------------------------------------------------------
    def _guard(self, attribute: str) -> None:
        """Wrap ``model.<attribute>`` so an exception in a step ends the run before it propagates."""
        model = self._fit_model
        function = getattr(model, attribute, None)
        if function is None or (isinstance(function, _GuardedStep) and function.callback is self):
            return
        original = function.wrapped if isinstance(function, _GuardedStep) else function
        setattr(model, attribute, _GuardedStep(original, self, attribute))

    def _unguard(self) -> None:
        model = self._fit_model
        for attribute in ("train_function", "test_function"):
            function = getattr(model, attribute, None)
            if isinstance(function, _GuardedStep) and function.callback is self:
                setattr(model, attribute, function.wrapped)

    def _fit_raised(self, exception: BaseException, in_train_step: bool) -> None:
        self._unguard()
        with self._lock:
            # The batch ends of the steps before this one may still be on Keras' pool: record them first.
            unfinished = 1 if in_train_step else 0
            self._lock.wait_for(
                lambda: self._batches_ended >= self._batches_begun - unfinished, timeout=PENDING_BATCH_ENDS_SECONDS
            )
            run = self.run
            if self._advisor is not None:
                self._advisor.close()
            if run is not None and not run.finished:
                run.finish_with(exception)


class _GuardedStep:
    """A model's step function that tells the callback about an exception before it propagates.

    It remembers what it wrapped and whose it is, so the callback that set it
    (and only that one) puts the original back.
    """

    def __init__(self, wrapped: Callable[..., Any], callback: TpudashCallback, attribute: str) -> None:
        self.wrapped = wrapped
        self.callback = callback
        self.attribute = attribute

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        profiler = self.callback._profiler() if self.attribute == "train_function" else None
        try:
            if profiler is None:
                return self.wrapped(*args, **kwargs)
            with profiler.marker(self.callback._step):  # the step marker XProf reads steps from
                return self.wrapped(*args, **kwargs)
        except BaseException as exception:
            if type(exception).__name__ not in END_OF_DATA:
                self.callback._fit_raised(exception, in_train_step=self.attribute == "train_function")
            raise


def _keras_distribution() -> Any:
    """The Keras distribution in use (``keras.distribution.set_distribution``), or None."""
    try:
        return keras.distribution.distribution()
    except (AttributeError, ImportError):  # a Keras without the distribution API
        return None


def _placement(runtime: dict[str, Any]) -> str:
    """Where the fit runs, for the run's log: "DataParallel over 8 replica(s) on CPU"."""
    strategy, kind = runtime.get("strategy", "none"), runtime.get("kind", "unknown")
    replicas = runtime.get("num_replicas", 1)
    if strategy == "none":
        return f"no distribution, {replicas} replica(s) on {kind}"
    return f"{strategy} over {replicas} replica(s) on {kind}"


def _shard_norms(shards: list[Any]) -> dict[str, Any]:
    """{device: the L2 norm of its shard}, each computed on its own device; jax scalars, not yet read to the host."""
    import jax.numpy as jnp  # only under Keras on JAX, which has imported it already

    return {str(shard.device): jnp.sqrt(jnp.sum(jnp.square(shard.data.astype(jnp.float32)))) for shard in shards}


def _variable_name(variable: Any, model: Any) -> str:
    """``dense/kernel``: the variable's path without the model's own name in front."""
    path = str(getattr(variable, "path", None) or getattr(variable, "name", "variable"))
    prefix = f"{getattr(model, 'name', '')}/"
    return path[len(prefix) :] if path.startswith(prefix) and len(path) > len(prefix) else path


def _mean_metric_names(model: Any) -> set[str]:
    """Log keys whose value is a running mean over the epoch (loss, accuracy…), which ``BatchMeans`` can unroll."""
    names = {"loss"}
    pending = list(getattr(model, "metrics", []) or [])
    while pending:
        metric = pending.pop()
        inner = getattr(metric, "metrics", None)
        if isinstance(inner, (list, tuple)) and not isinstance(metric, keras.metrics.Mean):
            pending.extend(inner)
        elif isinstance(metric, keras.metrics.Mean):
            names.add(metric.name)
    return names


def _describe_model(model: Any, fit_params: dict, batch_size: int | None) -> tuple[dict, list[list]]:
    """(params for run_started, the summary table's rows) of a compiled model."""
    optimizer = getattr(model, "optimizer", None)
    learning_rate = getattr(optimizer, "learning_rate", None)
    if learning_rate is not None:
        # A Keras variable reads as a number; a schedule is named by its class.
        value = to_jsonable(learning_rate) if hasattr(learning_rate, "numpy") else learning_rate
        learning_rate = value if isinstance(value, (int, float)) else type(learning_rate).__name__
    trainable = sum(int(_size(weight)) for weight in getattr(model, "trainable_weights", []))
    params = {
        "model": model.name,
        "parameters": int(model.count_params()) if model.built else 0,
        "trainable_parameters": trainable,
        # The class: Keras names a second Adam in a process "adam_1".
        "optimizer": type(optimizer).__name__ if optimizer is not None else None,
        "learning_rate": learning_rate,
        "loss": _loss_name(getattr(model, "loss", None)),
        "epochs": fit_params.get("epochs"),
        "steps_per_epoch": fit_params.get("steps"),
        "batch_size": batch_size,
        "steps_per_execution": getattr(model, "steps_per_execution", 1),
    }
    layers = []
    for layer in getattr(model, "layers", []):
        try:
            shape = str(tuple(layer.output.shape))
        except (AttributeError, ValueError, RuntimeError):
            shape = "?"
        layers.append([layer.name, type(layer).__name__, shape, int(layer.count_params()) if layer.built else 0])
    return {name: value for name, value in params.items() if value is not None}, layers


def _size(weight: Any) -> int:
    size = 1
    for dimension in getattr(weight, "shape", ()):
        size *= int(dimension or 0)
    return size


def _loss_name(loss: Any) -> str | None:
    if loss is None or isinstance(loss, str):
        return loss
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__
