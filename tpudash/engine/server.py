"""The engine's loop: the control pipe's commands executed, jobs run one at a time, the replies sent.

A TPU host admits one process to its chips, a mismatched libtpu aborts the
process that imports it, and TensorFlow's threads compete with whatever
shares their process. So the dashboard never imports TensorFlow: it starts
an engine (``python -m tpudash.engine``, see ``tpudash.engine.__main__``),
which detects the runtime once, stays warm between jobs, and runs them one
at a time through the same ``Runner`` as ``tpudash run``. Runs report the
way every run does, into their run directory; the dashboard tails
``events.jsonl`` like any other run.

``serve`` reads commands and writes replies, the messages of
``tpudash.engine.protocol``, until the dashboard releases the engine or
closes the pipe; then ``EngineServer`` cancels its job and waits a grace
period for the record. The runtime is handed in (``runtime_provider``), so
this loop imports no TensorFlow itself: ``EngineThread`` runs it in a test's
own process.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any

from tpudash.accel.startup import TensorFlowMissing
from tpudash.childproc import ID_FIELD, decode_line, encode_line
from tpudash.config import ENGINE_IDLE
from tpudash.engine.hostlock import EngineLock, LockHolder
from tpudash.engine.protocol import (
    COMMANDS,
    PROTOCOL_VERSION,
    AcceleratorHeld,
    Cancel,
    Command,
    Describe,
    Hello,
    JobFinished,
    JobStarted,
    Launch,
    LaunchRefused,
    ProtocolError,
    Release,
    Reply,
    RuntimeFailed,
    RuntimeReady,
    decode,
    encode,
)

# A released engine gets its cancel grace (2 s) to record its job's end, then exits; its successor waits that long.
OWN_ENGINE_EXIT_SECONDS = 5.0
LOCK_RETRY_SECONDS = 0.05

RequestId = Any
"""A command's ``id`` as the dashboard sent it (an int; None for replies that answer no command)."""
ReplySender = Callable[[Reply, RequestId], None]


def engine_job_specs(extra: Iterable[Any] = ()) -> dict:
    """The registry, plus ``extra`` job specs (the test suite's engine entry point, ``tests.engine_main``, adds its own).

    Nothing here is read from the environment: an installed tpudash runs only the jobs it ships.
    """
    from jobs import registry

    specs = dict(registry())
    for spec in extra:
        specs[spec.name] = spec
    return specs


class EngineServer:
    """Executes the dashboard's commands: detection, one job at a time, cancel, release.

    ``send`` writes one reply with the id of the command it answers; commands
    come to ``handle`` one at a time (the control pipe's reader). Detection
    and jobs run on threads of their own, so a cancel is read while a job runs.
    ``host_lock`` (``tpudash.engine.hostlock.EngineLock``) is taken at ``start``,
    before detection imports TensorFlow; None leaves the host's lock alone.
    ``framework``: what the runtime provider starts (``tensorflow`` or ``jax``), said in the hello.
    """

    def __init__(
        self,
        send: ReplySender,
        settings: Any,
        job_specs: Mapping[str, Any],
        runtime_provider: Callable[[], Any],
        grace_seconds: float = 2.0,
        *,
        host_lock: EngineLock | None = None,
        dashboard_pid: int | None = None,
        framework: str = "tensorflow",
    ):
        from jobs.base import LAUNCHED_FROM_DASHBOARD
        from tpudash.engine.runner import Runner
        from tpudash.runs.store import RunStore

        self._send = send
        self._job_specs = dict(job_specs)
        self._runtime_provider = runtime_provider
        self._runtime_ready = threading.Event()
        self._runtime: Any = None
        self._runtime_error: BaseException | None = None
        self.grace_seconds = grace_seconds
        self.host_lock = host_lock
        self._dashboard_pid = dashboard_pid
        self.framework = framework
        # The engine runs what a dashboard's forms launch.
        self.runner = Runner(
            self._runtime_for_lane,
            RunStore(settings.runs_dir),
            settings,
            sinks=[self._report],
            launched_from=LAUNCHED_FROM_DASHBOARD,
        )
        self._job_threads: list[threading.Thread] = []
        self._launch_ids: dict[str, RequestId] = {}
        """Each run's launch command id, echoed by the run's started and finished."""
        self._detection = threading.Thread(target=self._detect, name="tpudash-engine-detect", daemon=True)

    def start(self) -> bool:
        """Say hello, take the host's engine lock and start detection; False when another engine holds the lock."""
        self._send(Hello(pid=os.getpid(), protocol=PROTOCOL_VERSION, framework=self.framework), None)
        if self.host_lock is not None:
            try:
                holder = self._take_host_lock(self.host_lock)
            except OSError as error:
                # The lock is advisory: without it the engine still runs (libtpu's own lock guards the chips).
                print(f"tpudash engine: the engine lock {self.host_lock.path} cannot be used: {error}", file=sys.stderr)
                holder = None
            if holder is not None:
                self._send(AcceleratorHeld(holder.describe(), str(self.host_lock.path)), None)
                return False
        self._detection.start()
        return True

    def _take_host_lock(self, lock: EngineLock) -> LockHolder | None:
        """Take the lock; None when taken, else who holds it.

        The holder may be this dashboard's previous engine, released a moment
        ago (a restart) and still recording its job's end: that one is waited
        for, up to ``OWN_ENGINE_EXIT_SECONDS``. Another dashboard's engine is named at once.
        """
        deadline = time.monotonic() + OWN_ENGINE_EXIT_SECONDS
        while True:
            holder = lock.acquire(self._dashboard_pid)
            if holder is None or holder.dashboard_pid != self._dashboard_pid or time.monotonic() >= deadline:
                return holder
            time.sleep(LOCK_RETRY_SECONDS)  # flock has no timeout: a short poll on a bounded wait

    # -- the runtime -----------------------------------------------------------------
    def _detect(self) -> None:
        # Ready is set before the reply goes out: a describe sent on hearing it is always answered.
        try:
            runtime = self._runtime_provider()
        except BaseException as error:  # noqa: BLE001 - reported, never fatal to the engine
            self._runtime_error = error
            self._runtime_ready.set()
            self._send(
                RuntimeFailed(
                    error=f"{type(error).__name__}: {error}",
                    message=str(error),
                    missing_tensorflow=isinstance(error, TensorFlowMissing),
                ),
                None,
            )
        else:
            self._runtime = runtime
            self._runtime_ready.set()
            self._send(RuntimeReady(runtime.description.to_dict()), None)
        finally:
            self._runtime_ready.set()

    def _runtime_for_lane(self) -> Any:
        self._runtime_ready.wait()
        if self._runtime_error is not None:
            raise RuntimeError(f"the runtime could not be set up: {self._runtime_error}")
        return self._runtime

    # -- commands ------------------------------------------------------------------------
    def handle(self, command: Command, request_id: RequestId = None) -> None:
        if isinstance(command, Describe):
            if self._runtime_ready.is_set():
                threading.Thread(target=self._redescribe, args=(request_id,), daemon=True).start()
        elif isinstance(command, Launch):
            self._launch(command, request_id)
        elif isinstance(command, Cancel):
            for run in ([self.runner.current] if self.runner.current else []) + self.runner.queued():
                if command.run_id in (None, run.run_id):
                    self.runner.cancel(run)

    def _redescribe(self, request_id: RequestId) -> None:
        if self._runtime is not None:
            self._send(RuntimeReady(self._runtime.description.to_dict()), request_id)

    def _launch(self, command: Launch, request_id: RequestId) -> None:
        spec = self._job_specs.get(command.job)
        try:
            if spec is None:
                raise KeyError(f"job {command.job!r} is not installed in the engine")
            params = spec.resolve(command.params)
        except Exception as error:  # noqa: BLE001 - the dashboard validated; this is a version skew
            self._send(LaunchRefused(command.run_id, f"{type(error).__name__}: {error}"), request_id)
            return
        self._launch_ids[command.run_id] = request_id
        queued = self.runner.submit(spec, params, run_id=command.run_id)
        thread = threading.Thread(target=self._execute, args=(queued,), name=f"tpudash-job-{command.job}", daemon=True)
        self._job_threads = [item for item in self._job_threads if item.is_alive()] + [thread]
        thread.start()

    def _execute(self, queued: Any) -> None:
        self.runner.execute(queued)
        if queued.started is None:
            # Cancelled before its turn: the runner reported nothing, so say it here.
            self._send(JobFinished(queued.run_id, queued.state, None), self._launch_ids.pop(queued.run_id, None))

    def _report(self, run: Any, event: Any) -> None:
        # A sink: the recorder has written the event before this runs, so the
        # dashboard reading events.jsonl on "finished" finds the end there.
        if event.type == "run_started":
            self._send(JobStarted(run.run_id, str(run.run_dir)), self._launch_ids.get(run.run_id))
        elif event.type == "run_finished":
            self._send(JobFinished(run.run_id, event.status, event.error), self._launch_ids.pop(run.run_id, None))

    def stop(self) -> None:
        """Cancel everything, give the jobs the grace period to record their end, drop the host's lock."""
        self.runner.cancel_all()
        deadline = time.monotonic() + self.grace_seconds
        for thread in self._job_threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self.host_lock is not None:
            self.host_lock.release()  # the engine process exits next (a thread engine's job is abandoned)


def serve(commands: IO[str], replies: IO[str], make_server: Callable[[ReplySender], EngineServer]) -> None:
    """Read commands line by line until ``Release`` or the pipe closes; reply on ``replies``.

    A line that is no command is skipped; a launch the engine cannot read is refused, saying why.
    When another engine holds the host's lock, ``serve`` returns after saying so.
    """
    lock = threading.Lock()

    def send(reply: Reply, request_id: RequestId) -> None:
        payload = encode(reply)
        if request_id is not None:
            payload[ID_FIELD] = request_id
        line = encode_line(payload)
        with lock:
            try:
                replies.write(line)
                replies.flush()
            except (OSError, ValueError):
                pass  # the dashboard is gone; the records on disk still say everything

    server = make_server(send)
    if not server.start():
        return  # another engine holds the accelerator: nothing to serve
    try:
        for line in commands:
            payload = decode_line(line)
            if payload is None:
                continue
            try:
                command = decode(payload, COMMANDS)
            except ProtocolError as error:
                run_id = payload.get("run_id")
                if payload.get("type") == Launch.TYPE and isinstance(run_id, str):
                    send(LaunchRefused(run_id, f"ProtocolError: {error}"), payload.get(ID_FIELD))
                continue
            if isinstance(command, Release):
                break
            server.handle(command, payload.get(ID_FIELD))
    finally:
        server.stop()


def lower_priority(setting: int | str) -> None:
    """Let the dashboard's keys win the CPU over training (``Settings.engine_nice``: ``idle``, or a nice increment).

    Called before the framework starts its threads, which inherit it. Under
    ``idle`` (SCHED_IDLE) the kernel preempts the engine at once for any
    thread that wakes, the dashboard's on a key, and gives it every cycle
    left. A nice increment only lowers the engine's share: on Linux's EEVDF
    scheduler a key still waited 25 ms at p95 for a core under nice 10 or 19
    while training kept both cores busy (BENCHMARKS.md, issue 37).
    """
    if setting == ENGINE_IDLE:
        policy = getattr(os, "SCHED_IDLE", None)  # Linux's; macOS has none
        if policy is not None:
            try:
                os.sched_setscheduler(0, policy, os.sched_param(0))
                return
            except OSError:
                pass
        setting = 19  # the least a nice value gives way
    increment = int(setting)
    if increment > 0:
        try:
            os.nice(increment)
        except OSError:
            pass
