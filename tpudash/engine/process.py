"""The engine: the one process of a dashboard session that owns TensorFlow and the accelerator.

A TPU host admits one process to its chips, a mismatched libtpu aborts the
process that imports it, and TensorFlow's threads compete with whatever
shares their process. So the dashboard never imports TensorFlow: it starts
this engine (``python -m tpudash.engine``), which detects the runtime once,
stays warm between jobs, and runs them one at a time through the same
``Runner`` as ``tpudash run``. Runs report the way every run does, into
their run directory; the dashboard tails ``events.jsonl`` like any other run.

The control pipe carries JSON lines. The dashboard sends ``describe``,
``launch`` (run id, job, params as text), ``cancel`` (run id) and ``release``;
the engine answers ``hello`` (pid), ``runtime`` (the description) or
``runtime_failed``, and ``started`` / ``finished`` per run. The engine's
stdout is the pipe only (a job's prints join its stderr), and its stderr —
TensorFlow's C++ logs — goes to the session log, never the screen.

The engine runs at a lower CPU priority than the dashboard, in a session of
its own (the terminal's Ctrl-C is the dashboard's to handle), and ends when
the dashboard closes the pipe: it cancels its job, waits a grace period for
the record, and exits. ``EngineProcess`` is the dashboard's handle on it;
``EngineThread`` runs the same loop in a thread, for tests that run jobs
defined in the test itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable, Mapping

PROTOCOL_VERSION = 1
# A module named here (importable, with ``SPECS``) adds jobs to the engine's
# registry: tests use it for jobs that must never ship (one aborts its process).
EXTRA_JOBS_VARIABLE = "TPUDASH_ENGINE_EXTRA_JOBS"
ENGINE_LOG_VARIABLE = "TPUDASH_ENGINE_LOG"
STDERR_TAIL_LINES = 12

Message = dict
Listener = Callable[[Message], None]


# -- the engine side ----------------------------------------------------------------


def detect_runtime(settings: Any) -> Any:
    """``get_runtime(settings)``; after a failed automatic TPU attempt, the CPU default.

    The TPU is left alone and the failure becomes the reason the Devices
    screen gives for "why not TPU".
    """
    from tpudash.accel import runtime as runtime_module

    try:
        return runtime_module.get_runtime(settings)
    except runtime_module.TpuFallback as fallback:
        os.environ[runtime_module.FALLBACK_REASON_VARIABLE] = fallback.reason
        without_tpu = dataclasses.replace(settings, tpu=runtime_module.NO_TPU)
        return runtime_module.get_runtime(without_tpu, reinitialize=True)


def engine_job_specs(environ: Mapping[str, str] = os.environ) -> dict:
    """The registry, plus the jobs of the module named by ``TPUDASH_ENGINE_EXTRA_JOBS``."""
    import importlib

    from jobs import registry

    specs = dict(registry())
    extra = environ.get(EXTRA_JOBS_VARIABLE)
    if extra:
        for spec in importlib.import_module(extra).SPECS:
            specs[spec.name] = spec
    return specs


class EngineServer:
    """Executes the dashboard's commands: detection, one job at a time, cancel, release.

    ``send`` writes one reply; commands come to ``handle`` one at a time (the
    control pipe's reader). Detection and jobs run on threads of their own, so
    a cancel is read while a job runs.
    """

    def __init__(self, send: Listener, settings: Any, job_specs: Mapping[str, Any],
                 runtime_provider: Callable[[], Any], grace_seconds: float = 2.0):
        from tpudash.runs.store import RunStore
        from tpudash.engine.runner import Runner

        self._send = send
        self._job_specs = dict(job_specs)
        self._runtime_provider = runtime_provider
        self._runtime_ready = threading.Event()
        self._runtime: Any = None
        self._runtime_error: BaseException | None = None
        self.grace_seconds = grace_seconds
        self.runner = Runner(self._runtime_for_lane, RunStore(Path(settings.runs_dir)), settings,
                             sinks=[self._report])
        self._job_threads: list[threading.Thread] = []
        self._detection = threading.Thread(target=self._detect, name="tpudash-engine-detect", daemon=True)

    def start(self) -> None:
        self._send({"type": "hello", "pid": os.getpid(), "protocol": PROTOCOL_VERSION})
        self._detection.start()

    # -- the runtime -----------------------------------------------------------------
    def _detect(self) -> None:
        try:
            runtime = self._runtime_provider()
        except BaseException as error:  # noqa: BLE001 - reported, never fatal to the engine
            from tpudash.accel.runtime import TensorFlowMissing

            self._runtime_error = error
            self._send({"type": "runtime_failed", "error": f"{type(error).__name__}: {error}",
                        "message": str(error), "missing_tensorflow": isinstance(error, TensorFlowMissing)})
        else:
            self._runtime = runtime
            self._send({"type": "runtime", "description": runtime.description.to_dict()})
        finally:
            self._runtime_ready.set()

    def _runtime_for_lane(self) -> Any:
        self._runtime_ready.wait()
        if self._runtime_error is not None:
            raise RuntimeError(f"the runtime could not be set up: {self._runtime_error}")
        return self._runtime

    # -- commands ------------------------------------------------------------------------
    def handle(self, command: Message) -> None:
        op = command.get("op")
        if op == "describe":
            if self._runtime_ready.is_set():
                threading.Thread(target=self._redescribe, daemon=True).start()
        elif op == "launch":
            self._launch(command)
        elif op == "cancel":
            for run in ([self.runner.current] if self.runner.current else []) + self.runner.queued():
                if command.get("run_id") in (None, run.run_id):
                    self.runner.cancel(run)

    def _redescribe(self) -> None:
        if self._runtime is not None:
            self._send({"type": "runtime", "description": self._runtime.description.to_dict()})

    def _launch(self, command: Message) -> None:
        run_id, job = str(command.get("run_id")), str(command.get("job"))
        spec = self._job_specs.get(job)
        try:
            if spec is None:
                raise KeyError(f"job {job!r} is not installed in the engine")
            params = spec.resolve(command.get("params") or {})
        except Exception as error:  # noqa: BLE001 - the dashboard validated; this is a version skew
            self._send({"type": "refused", "run_id": run_id, "error": f"{type(error).__name__}: {error}"})
            return
        queued = self.runner.submit(spec, params, run_id=run_id)
        thread = threading.Thread(target=self._execute, args=(queued,), name=f"tpudash-job-{job}", daemon=True)
        self._job_threads = [item for item in self._job_threads if item.is_alive()] + [thread]
        thread.start()

    def _execute(self, queued: Any) -> None:
        self.runner.execute(queued)
        if queued.started is None:
            # Cancelled before its turn: the runner reported nothing, so say it here.
            self._send({"type": "finished", "run_id": queued.run_id, "status": queued.state, "error": None})

    def _report(self, run: Any, event: Any) -> None:
        # A sink: the recorder has written the event before this runs, so the
        # dashboard reading events.jsonl on "finished" finds the end there.
        if event.type == "run_started":
            self._send({"type": "started", "run_id": run.run_id, "run_dir": str(run.run_dir)})
        elif event.type == "run_finished":
            self._send({"type": "finished", "run_id": run.run_id, "status": event.status, "error": event.error})

    def stop(self) -> None:
        """Cancel everything, give the jobs the grace period to record their end."""
        self.runner.cancel_all()
        deadline = time.monotonic() + self.grace_seconds
        for thread in self._job_threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def serve(commands: IO[str], replies: IO[str], make_server: Callable[[Listener], EngineServer]) -> None:
    """Read commands line by line until ``release`` or the pipe closes; reply on ``replies``."""
    lock = threading.Lock()

    def send(message: Message) -> None:
        line = json.dumps(message, default=str) + "\n"
        with lock:
            try:
                replies.write(line)
                replies.flush()
            except (OSError, ValueError):
                pass  # the dashboard is gone; the records on disk still say everything

    server = make_server(send)
    server.start()
    try:
        for line in commands:
            try:
                command = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(command, dict):
                continue
            if command.get("op") == "release":
                break
            server.handle(command)
    finally:
        server.stop()


def _lower_priority(increment: int) -> None:
    """Let the dashboard's keys win the CPU over training (``Settings.engine_nice``)."""
    if increment > 0:
        try:
            os.nice(increment)
        except OSError:
            pass


def main() -> int:
    """``python -m tpudash.engine``: the engine process."""
    # Only the protocol may reach the dashboard on stdout: a job's print() or a
    # library's progress bar joins stderr (the session log) instead.
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(1, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    from tpudash.config import Settings

    settings = Settings.load()
    _lower_priority(settings.engine_nice)
    specs = engine_job_specs()
    serve(sys.stdin, replies, lambda send: EngineServer(send, settings, specs, lambda: detect_runtime(settings)))
    replies.close()
    # TensorFlow's interpreter teardown can take seconds and holds the TPU
    # meanwhile; the records are closed, so leave now.
    sys.stdout.flush()
    os._exit(0)


# -- the dashboard side --------------------------------------------------------------


@dataclasses.dataclass
class EngineExit:
    """How an engine ended: its return code, the signal that killed it, its last stderr lines."""

    returncode: int | None
    signal_name: str | None
    stderr_tail: list[str]
    requested: bool
    """True when the dashboard released or killed it (not a crash)."""

    def describe(self) -> str:
        if self.signal_name:
            return f"the engine was killed by {self.signal_name}"
        return f"the engine exited with status {self.returncode}"


class EngineHandle:
    """What the dashboard's lane needs of an engine: send, kill, and the messages it reports.

    ``listener`` is called on a reader thread with every message, then once
    with ``{"type": "exited", "exit": EngineExit}``.
    """

    pid: int | None = None

    def __init__(self, listener: Listener):
        self._listener = listener
        self._write_lock = threading.Lock()
        self._commands: IO[str] | None = None
        self.release_requested = False
        self.kill_reason: str | None = None

    def send(self, command: Message) -> bool:
        """Write one command; False when the engine is gone."""
        with self._write_lock:
            if self._commands is None:
                return False
            try:
                self._commands.write(json.dumps(command) + "\n")
                self._commands.flush()
                return True
            except (OSError, ValueError):
                return False

    def release(self) -> None:
        """Ask the engine to exit (it cancels its job, records it, and leaves)."""
        self.release_requested = True
        with self._write_lock:
            if self._commands is not None:
                try:
                    self._commands.write(json.dumps({"op": "release"}) + "\n")
                    self._commands.close()
                except (OSError, ValueError):
                    pass
                self._commands = None

    def kill(self, reason: str) -> None:
        raise NotImplementedError

    def _read_replies(self, replies: IO[str]) -> None:
        for line in replies:
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(message, dict):
                self._listener(message)

    @property
    def alive(self) -> bool:
        raise NotImplementedError


class EngineProcess(EngineHandle):
    """``python -m tpudash.engine`` as a child: new session, stderr to ``log_path``."""

    def __init__(self, listener: Listener, settings: Any, log_path: Path, environ: Mapping[str, str] | None = None):
        super().__init__(listener)
        from tpudash.config import settings_environment

        self.log_path = Path(log_path)
        environment = settings_environment(settings, dict(os.environ if environ is None else environ))
        try:
            self._log_offset = self.log_path.stat().st_size
        except OSError:
            self._log_offset = 0
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tpudash.engine"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                env=environment, text=True, encoding="utf-8", errors="replace", bufsize=1,
                start_new_session=True, close_fds=True)
        self.pid = self._process.pid
        self._commands = self._process.stdin
        self._reader = threading.Thread(target=self._read_until_exit, name="tpudash-engine-reader", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def kill(self, reason: str) -> None:
        self.kill_reason = reason
        try:
            self._process.kill()
        except OSError:
            pass

    def _read_until_exit(self) -> None:
        try:
            self._read_replies(self._process.stdout)
        finally:
            returncode = self._process.wait()
            from tpudash.accel.nativelog import read_tail

            signal_name = None
            if returncode is not None and returncode < 0:
                try:
                    signal_name = signal.Signals(-returncode).name
                except ValueError:
                    signal_name = f"signal {-returncode}"
            tail = [line for line in read_tail(self.log_path, 200, self._log_offset) if line.strip()]
            requested = self.release_requested or self.kill_reason is not None
            self._listener({"type": "exited", "exit": EngineExit(returncode, signal_name,
                                                                 tail[-STDERR_TAIL_LINES:], requested)})


class EngineThread(EngineHandle):
    """The engine's loop on a thread of this process, over real pipes (tests with in-test jobs).

    It shares this process's runtime, so it cannot be killed: ``kill``
    cancels its job and closes the pipe instead.
    """

    def __init__(self, listener: Listener, settings: Any, job_specs: Mapping[str, Any],
                 runtime_provider: Callable[[], Any]):
        super().__init__(listener)
        command_read, command_write = os.pipe()
        reply_read, reply_write = os.pipe()
        self._commands = os.fdopen(command_write, "w", encoding="utf-8", buffering=1)
        replies = os.fdopen(reply_read, "r", encoding="utf-8")
        self._server: EngineServer | None = None

        def make_server(send: Listener) -> EngineServer:
            self._server = EngineServer(send, settings, job_specs, runtime_provider, grace_seconds=0.0)
            return self._server

        def run_engine() -> None:
            with os.fdopen(command_read, "r", encoding="utf-8") as commands, \
                    os.fdopen(reply_write, "w", encoding="utf-8", buffering=1) as reply_stream:
                serve(commands, reply_stream, make_server)

        self._engine = threading.Thread(target=run_engine, name="tpudash-engine-thread", daemon=True)
        self._engine.start()

        def read() -> None:
            try:
                self._read_replies(replies)
            finally:
                replies.close()
                self._listener({"type": "exited", "exit": EngineExit(
                    0, None, [], self.release_requested or self.kill_reason is not None)})

        self._reader = threading.Thread(target=read, name="tpudash-engine-thread-reader", daemon=True)
        self._reader.start()
        self.pid = os.getpid()

    @property
    def alive(self) -> bool:
        return self._reader.is_alive()

    @property
    def server(self) -> EngineServer | None:
        """The engine's loop (a test may add a sink to its runner, as a job's own code would)."""
        return self._server

    def kill(self, reason: str) -> None:
        self.kill_reason = reason
        if self._server is not None:
            self._server.runner.cancel_all()
        self.release()


if __name__ == "__main__":
    raise SystemExit(main())
