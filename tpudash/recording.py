"""Record a run from the user's own process: ``tpudash.record`` and what ``TpudashCallback`` writes through.

A notebook or script that trains by itself holds the accelerator, so the
dashboard cannot run its training; it watches instead. ``RecordedRun``
writes a run into the runs directory in exactly the format jobs write
(run.json + events.jsonl, the same ``RunRecorder``), so the History screen,
the live view and ``tpudash watch`` read it as they read any run:

    with tpudash.record("my-loop", params={"lr": 0.1}) as run:
        for step in range(steps):
            loss = trainchecked_step()
            run.metric("loss", loss, step=step)
            run.progress(step + 1, steps, "step")

Leaving the ``with`` block normally records ``done``; an exception records
``failed`` with its traceback; KeyboardInterrupt records ``cancelled``. The
training thread never waits for the disk: events are buffered and written
by a writer thread every quarter second (fsync at most every second), so a
killed process loses at most that much. On a full disk training goes on
and nothing raises, finishing included; ``RecordedRun.write_error`` says
what could not be written. A run still open when the process exits is
recorded as failed. Imports neither TensorFlow, JAX nor Textual; it
describes TensorFlow's strategy, or JAX's devices and mesh
(``tpudash.recording_runtime``), only when the user's process has loaded them.

Profiles. A run on TensorFlow or JAX answers the dashboard's profile
requests (``tpudash.profiles.capture``): ``with run.step(n):`` around each
step marks it for XProf and starts a profile asked for; a loop that only
calls ``run.progress(n, unit="step")`` is profiled too, without markers.

JAX values cost no host sync: ``run.metric("loss", loss)`` with a jax scalar
checks its shape and dtype and returns; the number is read on the run's
reader thread (``tpudash.device_values``) once the device has it, and lands
in the record in the order of the calls. ``flush`` and ``finish`` wait for
what is still being computed (at most ``DEVICE_READ_WAIT_SECONDS``).

Many workers, one run. A script started on every worker of a cluster
(``TF_CONFIG``, a MultiWorkerMirroredStrategy, a JAX job on every host)
records one run: the worker is found by ``tpudash.runs.workers.find_worker``
(``worker=`` as given, TF_CONFIG's task, the strategy's cluster resolver, JAX's
process index); the chief (worker 0) creates the run and its run.json, every
other worker joins it with a stream and a heartbeat of its own. All of them
must name the same run, and nothing they share tells them a name without
talking to each other, so with several workers the run id is required: the
same ``run_id=`` on every worker, or ``$TPUDASH_RUN_ID`` set for all of them
(what a launcher does); without either, RecordingError says so before
anything is written.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import traceback as traceback_module
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from jobs.events import (
    LOG_LEVELS,
    SPLITS,
    Artifact,
    Event,
    Log,
    Metric,
    Progress,
    ReplicaValues,
    RunFinished,
    RunStarted,
    Table,
    to_jsonable,
)
from tpudash.accel import jaxruntime

if TYPE_CHECKING:
    from tpudash.advice.live import RunAdvisor
    from tpudash.advice.report import AdviceReport
from tpudash.device_values import DeviceValueReader
from tpudash.profiles.capture import ProfileResponder
from tpudash.profiles.requests import FRAMEWORKS
from tpudash.recording_args import RUN_ID_VARIABLE as RUN_ID_VARIABLE
from tpudash.recording_args import (
    RecordingError,
    check_run_name_and_params,
    checked_number,
    checked_step,
    find_recording_worker,
    read_part,
    replica_parts,
    run_id_word,
    runs_directory,
    shared_run_id,
)
from tpudash.recording_args import per_replica_parts as per_replica_parts  # callers import these from here
from tpudash.recording_runtime import session_runtime as session_runtime  # callers import it from here
from tpudash.runs.layout import SOURCE_CALLBACK, SOURCE_RECORD, new_run_id
from tpudash.runs.store import Recorder, RunStore
from tpudash.runs.workers import WorkerIdentity

# How often buffered events reach the file: the dashboard's redraw beat is
# half a second, and a killed process loses at most this much.
FLUSH_INTERVAL_SECONDS = 0.25
DEVICE_READ_WAIT_SECONDS = 30.0
"""How long ``flush`` and ``finish`` wait for JAX values still being computed before going on without them."""
# At exit JAX may be shutting down its backends: a short wait, then the run ends without what is left.
EXIT_READ_WAIT_SECONDS = 2.0
# How often a run looks for profile requests (``tpudash.profiles.capture``): one listing a second at most.
PROFILE_POLL_SECONDS = 1.0


class RecordedRun:
    """One run written from the user's process; see the module docstring."""

    def __init__(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        *,
        runs_dir: str | os.PathLike | None = None,
        strategy: Any = None,
        runtime: Mapping[str, Any] | None = None,
        source: str = SOURCE_RECORD,
        worker: int | WorkerIdentity | None = None,
        run_id: str | None = None,
    ):
        """``worker`` and ``run_id``: which worker of a cluster this is and the run they share (module docstring)."""
        check_run_name_and_params(name, params)
        self.name = name.strip()
        self.params = to_jsonable(dict(params or {}))
        self.runtime = dict(runtime) if runtime is not None else session_runtime(strategy)
        self.worker = find_recording_worker(worker, strategy)
        """Which worker of a cluster records (None: this process trains alone)."""
        shared = shared_run_id(run_id, self.worker)
        store = RunStore(runs_directory(runs_dir))
        store.prepare()
        self.run_id = shared or new_run_id(run_id_word(self.name))
        self.location = store.location(self.run_id)
        """Where the run is written: its directory, or its URL in a store."""
        if self.worker is not None:
            self.runtime["worker"] = {
                "index": self.worker.index,
                "count": self.worker.count,
                "task": self.worker.task,
                "host": self.worker.host,
            }
        self._recorder: Recorder
        if self.worker is not None and not self.worker.is_chief:
            self._recorder = store.join(self.run_id, self.name, self.params, self.runtime, worker=self.worker)
        else:
            self._recorder = store.create(
                self.run_id,
                self.name,
                self.params,
                self.runtime,
                source=source,
                flush_interval=FLUSH_INTERVAL_SECONDS,
                worker=self.worker,
            )
        self.status: str | None = None
        """None while running; then done, failed or cancelled."""
        self._steps: dict[tuple[str, str], int] = {}
        self._reader = DeviceValueReader(self._recorder.record, self.run_id)
        self._emit(RunStarted(self.run_id, self.name, self.params, to_jsonable(self.runtime), time.time()))
        self._store = store
        self.files = store.files(self.run_id)
        """The run's files (a directory, or a prefix in a store): where advice.json and profiles go."""
        self.profiler = self._profile_responder(store)
        """Answers profile requests (``tpudash.profiles.capture``) through ``step``; None: no TensorFlow or JAX here."""
        # ``progress`` in steps drives the profiler in a loop that calls nothing else; Keras's callback drives it
        # itself (its progress may come on Keras's pool threads, and only every tenth of a second).
        self._progress_steps = source != SOURCE_CALLBACK
        self._advisor: RunAdvisor | None = None
        self._last_step = 0
        _open_runs.add(self)

    def _profile_responder(self, store: RunStore) -> ProfileResponder | None:
        framework = self.runtime.get("backend")
        if framework not in FRAMEWORKS:
            return None
        responder = ProfileResponder(
            self.files,
            framework=str(framework),
            worker=self.worker.index if self.worker is not None else 0,
            local_root=self.run_dir,  # a bucket run's local directory, uploaded at the finish if a capture stays
            poll_seconds=PROFILE_POLL_SECONDS,
            log=lambda level, text: self.log(text, level),
        )
        return responder.start()

    @property
    def run_dir(self) -> Path:
        """The run's directory on this host (in a store: its local directory, uploaded at the finish)."""
        return self._recorder.run_dir

    @property
    def finished(self) -> bool:
        return self.status is not None

    @property
    def write_error(self) -> OSError | None:
        """The first write of the record that failed (a full disk): training goes on, the record has a gap."""
        return self._recorder.write_error

    def _emit(self, event: Event) -> None:
        if self.status is not None and not isinstance(event, RunFinished):
            raise RecordingError(f"run {self.run_id} has finished ({self.status}); start a new one to record more")
        self._reader.record(event)

    def _emit_later(self, build: Callable[[], Event], what: str) -> None:
        """An event holding device values: built (the values read) on the reader's thread, in order."""
        if self.status is not None:
            raise RecordingError(f"run {self.run_id} has finished ({self.status}); start a new one to record more")
        self._reader.later(build, what)

    # -- what the user records -------------------------------------------------------------
    def metric(self, name: str, value: Any, step: Any = None, epoch: Any = None, split: str = "train") -> None:
        """One scalar: ``loss`` at ``step`` (default: one after this metric's last), in ``train``, ``val`` or ``test``.

        ``value`` may be a JAX scalar (shape () or one element): checked now
        from its shape and dtype, its number read on the run's reader thread,
        so the call does not wait for the device.
        """
        if not isinstance(name, str) or not name:
            raise RecordingError(f"name: {name!r} is not allowed; allowed: a non-empty metric name such as 'loss'")
        if split not in SPLITS:
            raise RecordingError(f"split: {split!r} is not allowed; allowed: {', '.join(SPLITS)}")
        key = (name, split)
        step_number = self._steps.get(key, -1) + 1 if step is None else checked_step("step", step)
        self._steps[key] = step_number
        epoch_number = None if epoch is None else checked_step("epoch", epoch)
        if jaxruntime.is_jax_array(value):
            problem = jaxruntime.scalar_problem(value)
            if problem is not None:
                raise RecordingError(f"value: {problem}")
            self._emit_later(
                lambda: Metric(name, jaxruntime.read_scalar(value), step_number, epoch_number, split),
                f"{name} at step {step_number}",
            )
            return
        self._emit(
            Metric(name=name, value=checked_number("value", value), step=step_number, epoch=epoch_number, split=split)
        )

    def progress(self, done: Any, total: Any = None, unit: str = "step") -> None:
        """``done`` of ``total`` ``unit``s (total None: unknown); unit ``epoch`` rewrites run.json."""
        if not isinstance(unit, str) or not unit:
            raise RecordingError(f"unit: {unit!r} is not allowed; allowed: a word such as 'step' or 'epoch'")
        steps = checked_step("done", done)
        self._emit(Progress(done=steps, total=None if total is None else checked_step("total", total), unit=unit))
        if unit == "step":
            self._last_step = steps
        elif unit == "epoch" and self._advisor is not None:
            mfu = self._advisor.epoch_end(steps, self._last_step).mfu
            if mfu is not None and mfu.mfu is not None:
                self.metric("mfu", mfu.mfu, step=self._last_step, epoch=steps)
        profiler = self.profiler
        if profiler is not None and unit == "step" and self._progress_steps:
            profiler.step_end(steps)  # step ``done`` is over, the next one begins: a profile asked for starts there
            profiler.step_begin(steps + 1)

    def step(self, step: int) -> AbstractContextManager[Any]:
        """``with run.step(n):`` around training step ``n``: its step marker, and a profile asked for starts here.

        The framework's step marker (what XProf's step-time figures read) costs
        about a microsecond; nothing else is done while no profile is asked for.
        """
        self._last_step = step
        profiler = self.profiler
        if profiler is None:
            return nullcontext()
        self._progress_steps = False  # the loop numbers its steps here: its progress no longer drives the profiler
        return _ProfiledStep(profiler, step if type(step) is int else checked_step("step", step))

    def advise(
        self, *, flops_per_step: float | None = None, global_batch: int | None = None, dataset: Any = None
    ) -> AdviceReport:
        """Keep this run's advice (``tpudash.advice``): the Advice tab, ``tpudash advise``, MFU in ``tpudash runs``.

        ``flops_per_step``: the step's FLOPs (``tpudash.advice.flops.step_flops_jax(train_step, *args)``
        counts a jitted step), for MFU against the TPU's published peak or the host's measured one.
        ``global_batch`` judges the batch per device; ``dataset`` (a tf.data dataset) the input pipeline.
        MFU is measured at every ``progress(n, unit="epoch")`` from the steps since the last one
        (``run.step(n)`` or ``progress(n, unit="step")``); under JAX its compilations are counted
        (``recompiles``). Call it once, before training; a second call starts over.
        """
        from tpudash.advice.fitadvice import start_loop_advice

        if flops_per_step is not None and not (isinstance(flops_per_step, (int, float)) and flops_per_step > 0):
            raise RecordingError(f"flops_per_step: {flops_per_step!r} is not allowed; allowed: a number > 0, or None")
        if global_batch is not None and (isinstance(global_batch, bool) or not isinstance(global_batch, int)):
            raise RecordingError(f"global_batch: {global_batch!r} is not allowed; allowed: a whole number, or None")
        self._advisor = start_loop_advice(self, self._store, flops_per_step, global_batch, dataset)
        assert self._advisor.report is not None
        return self._advisor.report

    def input(self) -> AbstractContextManager[Any]:
        """``with run.input():`` around fetching a batch, inside ``run.step(n)``: a profile counts it as input.

        XProf tells waiting for input from computing by name (a tf.data stage, or a span named
        ``IteratorGetNext``); a Python data loader is host compute to it unless marked so. Costs about
        a microsecond, nothing when the run has no profiler.
        """
        profiler = self.profiler
        return nullcontext() if profiler is None else profiler.input_marker()

    def replica_values(self, name: str, per_replica_value: Any, devices: Iterable[str] | None = None) -> None:
        """One value per replica: a ``PerReplica`` (what ``strategy.run`` returns), a sharded ``jax.Array`` or a
        ``pmap`` output (one value per device shard), a list, or {device: value}; JAX values are read as
        ``metric`` reads them, off the training thread."""
        parts, names = replica_parts(per_replica_value, devices)
        if any(jaxruntime.is_jax_array(part) for part in parts):
            self._emit_later(
                lambda: ReplicaValues(name=str(name), values=[read_part(part) for part in parts], devices=names),
                f"replica values {name}",
            )
            return
        self._emit(ReplicaValues(name=str(name), values=[to_jsonable(part) for part in parts], devices=names))

    def log(self, text: str, level: str = "info") -> None:
        if level not in LOG_LEVELS:
            raise RecordingError(f"level: {level!r} is not allowed; allowed: {', '.join(LOG_LEVELS)}")
        self._emit(Log(level=level, text=str(text)))

    def table(self, title: str, columns: Iterable[Any], rows: Iterable[Iterable[Any]]) -> None:
        self._emit(
            Table(title=str(title), columns=to_jsonable(list(columns)), rows=to_jsonable([list(row) for row in rows]))
        )

    def artifact(self, kind: str, path: str | os.PathLike) -> None:
        """A file or directory the run produced (a checkpoint, a TensorBoard logdir)."""
        self._emit(Artifact(kind=str(kind), path=str(path)))

    def flush(self) -> None:
        """Put everything recorded so far on disk now (it goes there within a quarter second anyway).

        Waits for the device values recorded so far (at most ``DEVICE_READ_WAIT_SECONDS``).
        """
        self._reader.wait(DEVICE_READ_WAIT_SECONDS)
        self._recorder.flush()

    def finish(
        self,
        status: str = "done",
        summary: Mapping[str, Any] | None = None,
        error: str | None = None,
        traceback: str | None = None,
    ) -> None:
        """End the run (once; later calls do nothing): done, failed or cancelled.

        The device values recorded before are read first, waiting at most
        ``DEVICE_READ_WAIT_SECONDS`` for the device; a log line counts any left out.
        """
        self._finish(status, summary, error, traceback, read_wait=DEVICE_READ_WAIT_SECONDS)

    def _finish(
        self,
        status: str,
        summary: Mapping[str, Any] | None,
        error: str | None,
        traceback: str | None,
        *,
        read_wait: float,
    ) -> None:
        if status not in ("done", "failed", "cancelled"):
            raise RecordingError(f"status: {status!r} is not allowed; allowed: done, failed, cancelled")
        if self.profiler is not None and self.status is None:
            self.profiler.close()  # before the end: a profile cut short is answered and said in the run's log
        with _finish_lock:
            if self.status is not None:
                return
            self.status = status
        _open_runs.discard(self)
        unread = self._reader.wait(read_wait)
        self._reader.stop()
        if self._advisor is not None:
            summary = {**self._advisor.finish(), **dict(summary or {})}
        if unread:
            self._recorder.record(
                Log(
                    level="warning",
                    text=f"{unread} recorded value(s) were still being computed on the device when the run ended "
                    f"(waited {read_wait:g} s); they are not in the record",
                )
            )
        self._recorder.record(
            RunFinished(status=status, summary=to_jsonable(dict(summary or {})), error=error, traceback=traceback)
        )

    def finish_with(self, exception: BaseException) -> None:
        """End the run as ``exception`` ended it: KeyboardInterrupt is a cancel, anything else a failure."""
        cancelled = isinstance(exception, KeyboardInterrupt)
        trace = "".join(traceback_module.format_exception(type(exception), exception, exception.__traceback__))
        self.finish(
            "cancelled" if cancelled else "failed", error=f"{type(exception).__name__}: {exception}", traceback=trace
        )

    def __enter__(self) -> RecordedRun:
        return self

    def __exit__(self, exc_type, exception, trace) -> Literal[False]:
        if exception is None:
            self.finish("done")
        elif isinstance(exception, (Exception, KeyboardInterrupt)):
            self.finish_with(exception)
        else:  # SystemExit, GeneratorExit: the program is leaving, not failing
            self.finish("cancelled", error=f"{type(exception).__name__}")
        return False

    def __repr__(self) -> str:
        return f"<RecordedRun {self.run_id} {self.status or 'running'} in {self.location}>"


class _ProfiledStep:
    """``RecordedRun.step``'s context: the profiler's step hooks around the framework's step marker."""

    __slots__ = ("marker", "profiler", "step")

    def __init__(self, profiler: ProfileResponder, step: int) -> None:
        self.profiler, self.step = profiler, step

    def __enter__(self) -> None:
        self.profiler.step_begin(self.step)
        self.marker = self.profiler.marker(self.step)
        self.marker.__enter__()

    def __exit__(self, *raised: Any) -> Literal[False]:
        try:
            self.marker.__exit__(*raised)
        finally:
            self.profiler.step_end(self.step)
        return False


# Runs still open when the interpreter exits: the program left without
# finishing them (an exception outside the ``with``, os._exit excepted).
_open_runs: set[RecordedRun] = set()
_finish_lock = threading.Lock()


@atexit.register
def _finish_open_runs() -> None:
    for run in list(_open_runs):
        try:
            run._finish(
                "failed", None, "the process exited before the run finished", None, read_wait=EXIT_READ_WAIT_SECONDS
            )
        except Exception:  # noqa: BLE001 - exiting anyway; the run reads as interrupted
            pass
