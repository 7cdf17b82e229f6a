"""The job queue, the one accelerator lane, cancel, and the fan-out to sinks.

Jobs run one at a time in submit order: ``submit`` puts a run in the queue,
``execute`` (called from whatever thread should do the work — the CLI's job
thread or a Textual thread worker) waits for the run's turn on the lane, runs
it, and turns every outcome into a ``RunFinished``: done, cancelled, or failed
with the error and traceback. Every event goes to the run's recorder first,
then to the sinks; a sink that raises is logged and skipped, never fatal.
A record that cannot be written (a full disk, a quota, an I/O error) ends
the run as failed, naming the OS error; the sinks still hear its end, so the
engine reports it and ``tpudash run`` says it. This module never imports
textual.

Many workers: a process that is one worker of a training cluster
(``tpudash.runs.workers.find_worker``: TF_CONFIG, set from ``tpudash run
--worker-index/--cluster`` or exported by the user) records its run with
``RunStore.create(worker=…)`` on the chief and ``RunStore.join`` on the
others. A run whose params ask for several ``workers`` in a process that is
no worker (the dashboard's engine, ``tpudash run --workers N``) is launched
on this machine (``tpudash.engine.cluster``): the chief worker writes it
under the same run id, its events reach this runner's sinks, and the runner
keeps no record of its own but ends the run when the chief could not.

Profiles: every recorded run answers ``tpudash profile`` and the dashboard's requests
(``tpudash.engine.profiling``): a job that ``profiles_steps`` gets the run's responder as
``JobContext.profiler``, any other job's requests are answered that it has no steps to profile;
the responder is closed when the job returns, before the run's finish is recorded.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.base import LAUNCHED_FROM_COMMAND_LINE, JobCancelled, JobContext, JobSpec, ParamError
from jobs.events import Artifact, Event, Log, RunFinished, RunStarted, to_jsonable
from tpudash.advice.live import RunAdvisor, peak_json, run_peak
from tpudash.config import resolve_framework
from tpudash.engine.profiling import captured, close_profiler, start_profiler
from tpudash.runs.layout import new_run_id
from tpudash.runs.recorder import cannot_write
from tpudash.runs.store import Recorder, RunStore
from tpudash.runs.workers import WorkerIdentity, find_worker

log = logging.getLogger(__name__)

Sink = Callable[["QueuedRun", Event], None]

STATE_QUEUED = "queued"
STATE_RUNNING = "running"


class RunNotWritable(Exception):
    """The run's record could not be written: the job is stopped and the run ends as failed."""

    def __init__(self, error: OSError):
        super().__init__(cannot_write(error))
        self.os_error = error


@dataclass(eq=False)
class QueuedRun:
    """A submitted job: queued, then running, then done/failed/cancelled."""

    run_id: str
    spec: JobSpec
    params: dict
    state: str = STATE_QUEUED
    cancel_event: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    summary: dict = field(default_factory=dict)
    error: str | None = None
    traceback: str | None = None
    run_dir: Path | None = None
    sinks: list[Sink] = field(default_factory=list)
    name: str | None = None
    """What the user called the run (``tpudash run --name``); None: one made from its job and params."""
    run_id_chosen: bool = False
    """The caller chose the run id; otherwise the workers of a cluster agree on their chief's."""
    done_event: threading.Event = field(default_factory=threading.Event)
    failed_sinks: set = field(default_factory=set)
    write_error: OSError | None = None
    """The first write of its record that failed (the run then ended as failed)."""

    @property
    def job(self) -> str:
        return self.spec.name

    @property
    def finished_state(self) -> bool:
        return self.done_event.is_set()


class Runner:
    """One lane, a FIFO queue, cancel tokens and sinks.

    ``runtime_provider`` returns the ``tpudash.accel.description.Runtime`` (it is called
    on the lane, so a TUI can start before the accelerator is connected).
    ``store`` is None to keep no records (tests of the runner alone).
    """

    def __init__(
        self,
        runtime_provider: Callable[[], Any],
        store: RunStore | None,
        settings: Any = None,
        sinks: Iterable[Sink] = (),
        launched_from: str = LAUNCHED_FROM_COMMAND_LINE,
    ):
        self._runtime_provider = runtime_provider
        self.launched_from = launched_from
        """Where the user launches these runs (``jobs.base.JobContext.launched_from``): a job's advice names it."""
        self.store = store
        self.settings = settings
        self._sinks: list[Sink] = list(sinks)
        self._condition = threading.Condition()
        self._waiting: list[QueuedRun] = []
        self._current: QueuedRun | None = None
        self.worker_program: tuple[str, ...] | None = None
        """What each launched worker runs before ``run JOB …`` (None: ``python -m tpudash``; the tests' stand-in)."""

    # -- sinks ---------------------------------------------------------
    def add_sink(self, sink: Sink) -> None:
        with self._condition:
            self._sinks.append(sink)

    # -- queue -----------------------------------------------------------
    def submit(
        self,
        spec: JobSpec,
        params: dict,
        sinks: Iterable[Sink] = (),
        run_id: str | None = None,
        name: str | None = None,
    ) -> QueuedRun:
        """Queue a run of ``spec`` with already validated ``params`` (``run_id``: chosen by the caller)."""
        run = QueuedRun(
            run_id=run_id or new_run_id(spec.name),
            spec=spec,
            params=dict(params),
            sinks=list(sinks),
            name=name,
            run_id_chosen=run_id is not None,
        )
        with self._condition:
            self._waiting.append(run)
            self._condition.notify_all()
        return run

    def queued(self) -> list[QueuedRun]:
        """Runs waiting for the lane, in the order they will run."""
        with self._condition:
            return list(self._waiting)

    @property
    def current(self) -> QueuedRun | None:
        """The run on the lane now, if any."""
        return self._current

    @property
    def busy(self) -> bool:
        with self._condition:
            return self._current is not None or bool(self._waiting)

    def cancel(self, run: QueuedRun) -> None:
        """Cancel a queued run (it never starts) or ask a running one to stop."""
        with self._condition:
            run.cancel_event.set()
            if run in self._waiting:
                self._waiting.remove(run)
                run.state = "cancelled"
                run.finished = time.time()
                run.done_event.set()
            self._condition.notify_all()

    def cancel_current(self) -> QueuedRun | None:
        run = self._current
        if run is not None:
            self.cancel(run)
        return run

    def cancel_all(self) -> None:
        for run in self.queued():
            self.cancel(run)
        self.cancel_current()

    # -- the lane ----------------------------------------------------------
    def execute(self, run: QueuedRun) -> QueuedRun:
        """Wait for ``run``'s turn, run it here, return it finished."""
        with self._condition:
            while not run.done_event.is_set() and (self._current is not None or self._waiting[0] is not run):
                self._condition.wait()
            if run.done_event.is_set():  # cancelled while queued
                return run
            self._waiting.remove(run)
            self._current = run
            run.state = STATE_RUNNING
            run.started = time.time()
        try:
            self._run_on_lane(run)
        finally:
            with self._condition:
                self._current = None
                run.finished = time.time()
                self._condition.notify_all()
            run.done_event.set()
        return run

    def run_now(self, spec: JobSpec, params: dict, sinks: Iterable[Sink] = ()) -> QueuedRun:
        """Submit and execute in the calling thread (headless and tests)."""
        return self.execute(self.submit(spec, params, sinks))

    def _run_on_lane(self, run: QueuedRun) -> None:
        recorder: Recorder | None = None
        context: JobContext | None = None
        profiler: Any = None
        status, error, trace = "done", None, None
        try:
            worker = find_worker()  # before the runtime: a run to launch on workers needs none here
            if worker is None and requested_workers(run.params) > 1:
                refuse_workers_on_jax(requested_workers(run.params), getattr(self.settings, "framework", "auto"))
                self._run_launched(run)
                return
            runtime = self._runtime_provider()
            description = runtime.summary() if hasattr(runtime, "summary") else {}
            # Before anything is recorded: a job with no runner for this framework says so and runs nothing.
            job_runner = run.spec.runner_for(getattr(runtime, "framework", "tensorflow"))
            if run.spec.check_runtime is not None:
                run.spec.check_runtime(run.params, runtime)
            if worker is not None and not run.run_id_chosen:
                from tpudash.accel.multiworker import agree_on_run_id

                # Each worker proposed an id of its own; the run is one, named as the chief named it.
                run.run_id = agree_on_run_id(getattr(runtime, "strategy", None), run.run_id)
            if self.store is not None and run.spec.profiles_steps:
                peak = run_peak(self.store, description)
                description = dict(description, mfu_peak=peak_json(peak))  # run.json says what MFU is against
            if self.store is not None:
                try:
                    recorder = self._recorder_for(run, worker, description)
                except OSError as create_error:
                    run.write_error = create_error
                    run.run_dir = None
                    raise RunNotWritable(create_error) from None
                run.run_dir = recorder.run_dir
            else:
                # No records kept: the job still gets a private place for its files.
                run.run_dir = Path(tempfile.mkdtemp(prefix=f"tpudash-{run.job}-"))
            advisor = None
            if self.store is not None and run.spec.profiles_steps:
                advisor = RunAdvisor(
                    self.store.files(run.run_id),
                    run.run_id,
                    description,
                    peak,
                    log=lambda text, level: self._dispatch(run, recorder, Log(level=level, text=text)),
                )
            self._dispatch(
                run, recorder, RunStarted(run.run_id, run.job, to_jsonable(run.params), description, time.time())
            )
            if self.store is not None:
                profiler = self._profiler_for(run, worker, recorder, getattr(runtime, "framework", "tensorflow"))
            context = JobContext(
                runtime=runtime,
                emit=lambda event: self._dispatch(run, recorder, event),
                run_dir=run.run_dir,
                cancel_event=run.cancel_event,
                settings=self.settings,
                launched_from=self.launched_from,
                profiler=profiler if run.spec.profiles_steps else None,
                advisor=advisor,
            )
            try:
                run.summary = dict(job_runner(context, dict(run.params)) or {})
            finally:
                captures = self._close_profiler(run, recorder, profiler)
            if captures and run.summary.get("profile") is None:
                run.summary["profile"] = captures[-1]  # where the run's last profile is
            if run.write_error is not None:  # the job caught RunNotWritable and went on
                raise RunNotWritable(run.write_error)
            if run.cancel_event.is_set():
                status = "cancelled"
        except JobCancelled:
            status = "cancelled"
        except RunNotWritable as not_writable:
            status, error = "failed", str(not_writable)
            if context is not None:
                run.summary = dict(context.kept_summary)
        except BaseException as exception:  # noqa: BLE001 - a job must never take the app down
            # A job interrupted by cancel or Ctrl-C often dies of it; that is a cancel.
            interrupted = isinstance(exception, (SystemExit, KeyboardInterrupt))
            status = "cancelled" if interrupted or run.cancel_event.is_set() else "failed"
            error = f"{type(exception).__name__}: {exception}"
            trace = traceback.format_exc()
            # A check that fails (a wrong device) still has results worth keeping.
            if context is not None:
                run.summary = dict(context.kept_summary)
        if run.write_error is not None and status != "failed":
            # The job ended on its own (done, or cancelled) but its record is incomplete.
            status, error = "failed", str(RunNotWritable(run.write_error))
        finished = RunFinished(status=status, summary=to_jsonable(run.summary), error=error, traceback=trace)
        if recorder is not None:
            recorder.record(finished)  # never raises: a failed write is in write_error
            if run.write_error is None and recorder.write_error is not None:
                # Only the finish could not be written: the run did not end as it says.
                run.write_error = recorder.write_error
                status, error = "failed", str(RunNotWritable(recorder.write_error))
                finished = RunFinished(status=status, summary=finished.summary, error=error, traceback=trace)
        run.state, run.error, run.traceback = status, error, trace
        self._fan_out(run, finished)

    def _profiler_for(
        self, run: QueuedRun, worker: WorkerIdentity | None, recorder: Recorder | None, framework: str
    ) -> Any:
        """The run's profile responder (``tpudash.engine.profiling``) for ``framework``'s profiler, started; None if
        it could not start."""
        assert self.store is not None

        def say(level: str, text: str) -> None:  # the responder's thread: the recorder and the sinks take locks
            self._dispatch(run, recorder, Log(level=level, text=text))

        return start_profiler(
            self.store.files(run.run_id),
            profiles_steps=run.spec.profiles_steps,
            worker=worker.index if worker is not None else 0,
            local_root=run.run_dir,
            started_at=run.started or time.time(),
            say=say,
            framework=framework,
        )

    def _close_profiler(self, run: QueuedRun, recorder: Recorder | None, profiler: Any) -> list[str]:
        """Close the run's responder (what is pending is answered); each capture it made, as an artifact."""
        if profiler is None:
            return []
        close_profiler(profiler)
        where = captured(profiler)
        try:
            for path in where:
                self._dispatch(run, recorder, Artifact(kind="profile", path=path))
        except RunNotWritable:
            pass  # the run ends failed, naming the write error, whatever the job did
        return where

    def _recorder_for(self, run: QueuedRun, worker: WorkerIdentity | None, description: dict) -> Recorder:
        """The run's recorder: the run created (alone, or by a cluster's chief), or joined (another worker)."""
        assert self.store is not None
        params = to_jsonable(run.params)
        if worker is None or worker.is_chief:
            return self.store.create(run.run_id, run.job, params, description, name=run.name, worker=worker)
        return self.store.join(run.run_id, run.job, params, description, worker=worker)

    def _run_launched(self, run: QueuedRun) -> None:
        """Run ``run`` on its workers, started on this machine; their chief records it, its events reach the sinks."""
        from tpudash.config import settings_environment
        from tpudash.engine.cluster import STOP_GRACE_SECONDS, ClusterLaunch, LaunchOutcome

        count = requested_workers(run.params)
        if self.store is None:
            outcome = LaunchOutcome("failed", f"a run on {count} workers needs a runs directory for them to write it")
        else:
            run.run_dir = self.store.local_dir(run.run_id)
            environment = dict(os.environ)
            if self.settings is not None:
                environment = settings_environment(self.settings, environment)
            environment["TPUDASH_RUNS_DIR"] = str(self.store.root)
            if self.settings is not None and getattr(self.settings, "tpu", None) is None:
                # N processes on one host cannot share its TPU chips: local workers train on the CPU unless told.
                environment["TPUDASH_TPU"] = "none"
            # A dashboard ends its engine when a cancelled job outlasts its cancel grace: the workers stop first.
            grace = STOP_GRACE_SECONDS
            if self.settings is not None and isinstance(getattr(self.settings, "cancel_grace", None), (int, float)):
                grace = min(grace, max(0.5, 0.75 * self.settings.cancel_grace))
            launch = ClusterLaunch(
                job=run.job,
                params=run.spec.as_text(run.params),
                run_id=run.run_id,
                count=count,
                store=self.store,
                environment=environment,
                on_event=lambda stamp, event: self._fan_out(run, event),
                name=run.name,
                grace=grace,
                **({"program": self.worker_program} if self.worker_program is not None else {}),
            )
            try:
                outcome = launch.run(run.cancel_event)
            except OSError as error:  # the workers could not be started (no such interpreter, no processes left)
                outcome = LaunchOutcome("failed", f"the {count} workers could not be started: {error}")
                self.store.finish_abandoned(run.run_id, run.job, run.spec.as_text(run.params), "failed", outcome.error)
        run.summary = dict(outcome.summary)
        run.state, run.error, run.traceback = outcome.status, outcome.error, outcome.traceback
        self._fan_out(
            run,
            RunFinished(
                status=outcome.status,
                summary=to_jsonable(run.summary),
                error=outcome.error,
                traceback=outcome.traceback,
            ),
        )

    def _dispatch(self, run: QueuedRun, recorder: Recorder | None, event: Event) -> None:
        """Record ``event``, then give it to the sinks; once the record cannot be written, stop the job."""
        if recorder is not None:
            if run.write_error is None:
                recorder.record(event, time.time())
                run.write_error = recorder.write_error
            if run.write_error is not None:
                raise RunNotWritable(run.write_error)
        self._fan_out(run, event)

    def _fan_out(self, run: QueuedRun, event: Event) -> None:
        with self._condition:
            sinks = self._sinks + run.sinks
        for sink in sinks:
            try:
                sink(run, event)
            except Exception:  # noqa: BLE001 - a broken front end must not stop the job
                # One traceback per sink and run is enough to diagnose it.
                if id(sink) not in run.failed_sinks:
                    run.failed_sinks.add(id(sink))
                    log.exception(
                        "sink %r failed on %s; later failures of it in this run are not logged", sink, event.type
                    )


def refuse_workers_on_jax(workers: int, framework_choice: str) -> None:
    """ParamError when ``workers`` > 1 would run on JAX: the workers are TensorFlow's (TF_CONFIG, MultiWorkerMirroredStrategy).

    On JAX one process drives every device of its host; a job across hosts is
    ``jax.distributed``, one process per host, started by the user (tpudash watches it: Many hosts).
    """
    if resolve_framework(framework_choice) == "jax":
        raise ParamError(
            "workers",
            f"{workers} worker processes train under TensorFlow's MultiWorkerMirroredStrategy (TF_CONFIG); on JAX one "
            "process drives every device of this host, and a job across hosts is jax.distributed, one process per "
            "host that you start; allowed on JAX: 1",
        )


def requested_workers(params: dict) -> int:
    """How many workers a run's params ask for (``workers``; 1 for a job that has no such param)."""
    workers = params.get("workers", 1)
    return workers if isinstance(workers, int) and not isinstance(workers, bool) else 1
