"""The Textual app: modes, key bindings, the command palette, workers and the event feed.

The first frame must appear before TensorFlow has finished importing, so this
module imports neither tensorflow nor any screen at import time: screens are
imported when their mode is first shown, and the runtime is detected in a
thread worker started after the first frame, next to a host check (chips,
installed TensorFlow build, the TPU's holder; no TensorFlow import) that the
Devices screen shows long before TensorFlow answers. Without TensorFlow the
app stays usable (Devices, Jobs, History, help) and refuses launches with the
install line. Jobs run in thread workers
through the Runner (one accelerator lane, FIFO queue). Workers never touch
widgets: a per-run sink buffers events and posts one ``RunEventsPending``
message per batch; the UI drains the buffer into the run's model and redraws
on its timer. While the TUI runs, file descriptor 2 (TensorFlow's C++ logs,
tqdm bars) goes to the session log, which the Log screen shows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import importlib
import os
import signal
import sys
import threading
import time
import traceback
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from textual import events, work
from textual.app import App, ScreenStackError
from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.message import Message
from textual.reactive import reactive
from textual.worker import Worker, WorkerState

from tpudash.clock import display_beat, format_seconds
from tpudash.config import Settings

if TYPE_CHECKING:  # the runner, records and host check load after the first frame
    from tpudash.hostcheck import HostCheck
    from tpudash.records import RunStore
    from tpudash.runner import QueuedRun, Runner

# How many runs may wait for the lane: a longer queue is more likely a key
# held down than a plan, and each waiting run is one more to cancel on quit.
MAX_WAITING_RUNS = 4
# Runs of this session kept in memory for the run view (their models are bounded).
MAX_SESSION_RUNS = 50
TICK_SECONDS = 0.1
FIRST_FRAME_ENV = "TPUDASH_EXIT_AFTER_FIRST_FRAME"
STATUS_EVENTS = ("run_started", "run_finished")

MODE_SCREENS = {
    "devices": ("screens.devices", "DevicesScreen", "Devices", "the runtime, strategy and logical devices"),
    "jobs": ("screens.jobs", "JobsScreen", "Jobs", "every job with its parameter form"),
    "run": ("screens.run", "RunScreen", "Run view", "the live view of this session's runs"),
    "history": ("screens.history", "HistoryScreen", "History", "past runs: open, overlay, export"),
    "log": ("screens.log", "SessionLogScreen", "Session log", "TensorFlow's native log and notifications"),
    "help": ("screens.help", "HelpScreen", "Help", "keys and what tpudash keeps"),
}


def _screen_factory(module_name: str, class_name: str) -> Callable[[], Any]:
    """A MODES entry that imports its screen module only when the mode is first shown."""

    def make_screen():
        return getattr(importlib.import_module(module_name), class_name)()

    make_screen.__name__ = f"make_{class_name}"
    return make_screen


class RunEventsPending(Message):
    """A run's sink buffered new events; the UI should drain them."""

    def __init__(self, run_id: str):
        super().__init__()
        self.run_id = run_id


class LiveRun:
    """A run launched in this session: its queue entry, its model, and its pending events.

    ``sink`` runs in the job thread: it appends to a locked buffer, which the
    UI drains on its tick, so a job emitting thousands of metrics a second
    costs the UI one drain per tick; only a run starting or ending posts a
    message, to be shown at once.
    """

    def __init__(self, app: "TpudashApp", model: Any):
        self.app = app
        self.queued: QueuedRun | None = None
        self.run_id = ""
        self.model = model
        self.worker: Worker | None = None
        self.settled = asyncio.Event()
        """Set once the UI has applied the run's end (and notified the user)."""
        self.queue_position = 0
        self._pending: list[tuple[float, Any]] = []
        self._lock = threading.Lock()
        self._message_posted = False

    def attach(self, queued: QueuedRun) -> None:
        self.queued, self.run_id, self.model.run_id = queued, queued.run_id, queued.run_id

    def sink(self, run: QueuedRun, event: Any) -> None:
        with self._lock:
            self._pending.append((time.time(), event))
            # Metrics, logs and progress wait for the UI's next tick (≤ 0.1 s):
            # waking the event loop for each would cost training CPU. A run
            # starting or ending is shown at once.
            post = event.type in STATUS_EVENTS and not self._message_posted
            self._message_posted = self._message_posted or post
        if post:
            self.app.post_message(RunEventsPending(self.run_id))

    def drain(self) -> bool:
        """Apply buffered events to the model; True if a status-changing event was among them."""
        with self._lock:
            batch, self._pending = self._pending, []
            self._message_posted = False
        if not batch:
            return False
        self.model.apply_all(batch)
        return any(event.type in STATUS_EVENTS for _, event in batch)


class TpudashCommands(Provider):
    """The command palette: every job (launch or open its form), every screen, runtime re-init."""

    def _commands(self) -> list[tuple[str, Callable, str]]:
        app = self.app
        commands: list[tuple[str, Callable, str]] = []
        for name, spec in app.job_specs.items():
            commands.append((f"Run {name}", partial(app.run_action, f"launch_job({name!r})"),
                             f"{spec.title}: launch with default params"))
            commands.append((f"Form: {name}", partial(app.run_action, f"open_form({name!r})"),
                             f"{spec.title}: set params, then enter to launch"))
        for mode, (_, _, label, help_text) in MODE_SCREENS.items():
            commands.append((f"Show {label}", partial(app.run_action, f"show({mode!r})"), help_text))
        commands.append(("Re-initialise the TPU (detect the runtime again)", app.action_reinitialize_runtime,
                         "connect, initialize the TPU system and rebuild the strategy"))
        commands.append(("Cancel the running job", app.action_cancel_job, "stop the job on the accelerator lane"))
        return commands

    async def discover(self) -> Hits:
        for name, callback, help_text in self._commands():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, callback, help_text in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)


class TpudashApp(App[int]):
    """tpudash: devices, jobs, live runs and history of a TensorFlow accelerator session."""

    CSS_PATH = "app.tcss"
    TITLE = "tpudash"
    MODES = {mode: _screen_factory(module, cls) for mode, (module, cls, _, _) in MODE_SCREENS.items()}
    DEFAULT_MODE = "devices"
    COMMANDS = App.COMMANDS | {TpudashCommands}
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    BINDINGS = [
        Binding("d", "show('devices')", "Devices", id="tpudash.devices",
                tooltip="the runtime, strategy, topology and logical devices"),
        Binding("j", "show('jobs')", "Jobs", id="tpudash.jobs", tooltip="every job with a form of its params"),
        Binding("h", "show('history')", "History", id="tpudash.history",
                tooltip="past runs: open one, overlay two, export CSV"),
        Binding("v", "show('run')", "Run", id="tpudash.run", tooltip="the live view of this session's runs"),
        Binding("m", "launch_job('matmul')", "Matmul", id="tpudash.matmul",
                tooltip="run the matmul check on every device (default params)"),
        Binding("r", "launch_job('replica-matmul')", "Replicas", id="tpudash.replica_matmul",
                tooltip="run strategy.run(matmul) on every replica (default params)"),
        Binding("g", "launch_job('gradient-descent')", "Grad.desc", id="tpudash.gradient_descent",
                tooltip="run seed 000's gradient descent (default params)"),
        Binding("t", "open_form('train')", "Train", id="tpudash.train", tooltip="open the train form; enter launches"),
        Binding("c", "cancel_job", "Cancel", id="tpudash.cancel", tooltip="cancel the running job"),
        Binding("l", "show('log')", "Log", id="tpudash.log", show=False,
                tooltip="the session log (TensorFlow's native output) and notifications"),
        Binding("question_mark", "show('help')", "Help", id="tpudash.help", key_display="?",
                tooltip="keys and what tpudash keeps"),
        Binding("q", "quit", "Quit", id="tpudash.quit", tooltip="quit (asks first while a job runs)"),
    ]

    # None of these is drawn by the app itself (widgets watch them), so none
    # repaints: a repaint of the app is a repaint of the whole screen.
    runtime_status: reactive[str] = reactive("connecting…", repaint=False)
    """One line about the runtime for the session bar: "connecting…", then kind, strategy, replicas."""
    lane_status: reactive[str] = reactive("idle", repaint=False)
    """One line about the accelerator lane: the running job, its status and time, the queue."""
    runtime: reactive[Any] = reactive(None, always_update=True, repaint=False)
    """The detected ``tpudash.runtime.Runtime`` (None while connecting or after a failure)."""
    runtime_error: reactive[str | None] = reactive(None, repaint=False)
    """Why runtime detection failed, if it did."""
    tensorflow_missing: reactive[str | None] = reactive(None, repaint=False)
    """Set when detection found no TensorFlow installed: why, ending with the install line for this host."""
    host_check: reactive[dict | None] = reactive(None, always_update=True, repaint=False)
    """What the host scan found before TensorFlow (``HostCheck.to_dict()``: chips, builds, holders, diagnoses)."""
    shown_run_id: reactive[str | None] = reactive(None, repaint=False)
    """The session run the Run view draws."""
    device_check: reactive[dict | None] = reactive(None, always_update=True, repaint=False)
    """The last matmul check: run id, time and per-device results (passed, GFLOP/s)."""
    lane_version: reactive[int] = reactive(0, repaint=False)
    """Bumped whenever a session run is queued, starts or ends (lists of runs redraw)."""

    def __init__(
        self,
        settings: Settings | None = None,
        runtime_provider: Callable[[], Any] | None = None,
        *,
        host_check_provider: Callable[[], HostCheck] | None = None,
        runner: Runner | None = None,
        job_specs: Mapping[str, Any] | None = None,
        redirect_stderr: bool = False,
        handle_signals: bool = False,
    ):
        """``runtime_provider`` replaces ``get_runtime(settings)`` (tests pass the session runtime).

        ``host_check_provider`` replaces ``tpudash.hostcheck.inspect`` (tests pass a TPU host).

        ``runner`` replaces the app's own Runner; ``job_specs`` the job registry.
        ``redirect_stderr`` sends fd 2 to the session log while the app runs
        (off by default so tests keep pytest's capture); ``handle_signals``
        makes SIGTERM/SIGINT cancel the running job cleanly, then exit.
        """
        super().__init__()
        self.settings = settings or Settings.load()
        self._runtime_provider = runtime_provider
        self._host_check_provider = host_check_provider
        self._job_specs = dict(job_specs) if job_specs is not None else None
        self.redirect_stderr = redirect_stderr
        self.handle_signals = handle_signals
        self._runner = runner
        self._store = runner.store if runner is not None else None
        self.live_runs: dict[str, LiveRun] = {}
        self.session_log = None
        """The ``NativeStderr`` holding fd 2 while the app runs (None when not redirected)."""
        self.notices: list[tuple[float, str, str]] = []
        """Every notification of this session: (time, severity, message)."""
        self.first_frame_at: float | None = None
        """Unix time of the first frame (``TPUDASH_EXIT_AFTER_FIRST_FRAME`` prints it)."""
        self.tensorflow_imported_at_first_frame: bool | None = None
        self.quitting = False
        """True once quit was confirmed: no new run starts."""
        self.exiting = False
        """True once exit() was called: timers stop drawing on closing widgets."""
        self.quit_worker: Worker | None = None
        """The worker that cancels every run and exits, once quit was confirmed."""
        # Set by the detection worker itself (not the UI), so the lane never
        # waits on a busy event loop.
        self._runtime_ready = threading.Event()
        self._runtime_value: Any = None
        self._runtime_failure: BaseException | None = None
        self._previous_mode = self.DEFAULT_MODE
        self._visited_modes = {self.DEFAULT_MODE}
        self._instant_switch = False
        self._signals_installed: list[int] = []
        self.runtime_settled = asyncio.Event()
        """Set when runtime detection has answered (runtime or error)."""
        self._tick_event = asyncio.Event()
        self._redraw_budget = None
        self._force_exit_code: int | None = None
        self._beat = 0

    # -- properties -----------------------------------------------------------------
    @property
    def runs_dir(self) -> Path:
        from tpudash.config import default_runs_dir

        return Path(self.settings.runs_dir or default_runs_dir(os.environ))

    @property
    def store(self) -> "RunStore":
        """The runs directory (created on first use, after the first frame)."""
        if self._store is None:
            from tpudash.records import RunStore

            self._store = RunStore(self.runs_dir)
        return self._store

    @property
    def runner(self) -> "Runner":
        """The one accelerator lane: ``Runner(wait for the detected runtime, store, settings)``."""
        if self._runner is None:
            from tpudash.runner import Runner

            self._runner = Runner(self._runtime_for_lane, self.store, self.settings)
        return self._runner

    @property
    def redraw_budget(self) -> Any:
        """The ``RedrawBudget`` every plot of this app shares."""
        if self._redraw_budget is None:
            from tpudash.widgets import RedrawBudget

            self._redraw_budget = RedrawBudget()
        return self._redraw_budget

    @property
    def job_specs(self) -> dict[str, Any]:
        """Every job the app offers, by name (the registry unless injected)."""
        if self._job_specs is None:
            from jobs import registry

            self._job_specs = dict(registry())
        return self._job_specs

    @property
    def active_live_run(self) -> LiveRun | None:
        """The session run that holds the lane's worker (started, not yet finished)."""
        return next((live for live in self.live_runs.values()
                     if live.worker is not None and not live.worker.is_finished), None)

    @property
    def current_live_run(self) -> LiveRun | None:
        if self._runner is None:
            return None
        current = self.runner.current
        return self.live_runs.get(current.run_id) if current is not None else None

    # -- lifecycle ------------------------------------------------------------------
    def on_load(self) -> None:
        # Before the driver exists, so Textual draws on a private copy of the
        # terminal while fd 2 (TensorFlow's C++ logs, tqdm) goes to the log.
        if self.redirect_stderr:
            from tpudash.nativelog import NativeStderr, session_log_path

            self.session_log = NativeStderr(session_log_path(self.runs_dir)).start()

    def on_mount(self) -> None:
        self.set_interval(TICK_SECONDS, self._tick, name="tpudash tick")
        if self.session_log is not None:
            # Python-level prints and warnings (Keras, tfds) join the C++ logs
            # in the session log instead of vanishing into Textual's capture.
            self.begin_capture_print(self)
        if self.handle_signals:
            self._install_signal_handlers()
        self.call_after_refresh(self._after_first_frame)

    def _after_first_frame(self) -> None:
        self.first_frame_at = time.time()
        self.tensorflow_imported_at_first_frame = "tensorflow" in sys.modules
        if os.environ.get(FIRST_FRAME_ENV):
            self.exit(0)
            return
        self.check_host()
        self.detect_runtime()
        self.load_last_device_check()

    def on_print(self, event: events.Print) -> None:
        try:
            os.write(2, event.text.encode("utf-8", errors="replace"))
        except OSError:
            pass

    def on_unmount(self) -> None:
        # However the app ends (quit, a crash, a test's shutdown), no job may
        # keep running unseen: cancel them, so their threads end and their
        # records say cancelled.
        if self._runner is not None:
            self._runner.cancel_all()
        for signum in self._signals_installed:
            try:
                asyncio.get_running_loop().remove_signal_handler(signum)
            except (RuntimeError, ValueError):
                pass
        if self._force_exit_code is not None and not self.is_headless and self.runner.current is not None:
            # The driver has restored the terminal by now (it stops before unmount).
            self.release_session_log()
            sys.stdout.flush()
            os._exit(self._force_exit_code)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().run(*args, **kwargs)
        finally:
            self.release_session_log()

    def exit(self, *args: Any, **kwargs: Any) -> None:
        self.exiting = True
        super().exit(*args, **kwargs)

    def release_session_log(self) -> None:
        """Point fd 2 (and sys.stderr) back where they were when the app started.

        ``run()`` calls this once the app has stopped: the driver restores the
        terminal through the private copy of fd 2 until the very end. A test
        driving ``run_test()`` calls it after the app has stopped, likewise.
        """
        if self.session_log is not None:
            self.session_log.stop()

    def notify(self, message: str, *, title: str = "", severity: str = "information", **kwargs: Any) -> None:
        self.notices.append((time.time(), severity, f"{title}: {message}" if title else message))
        del self.notices[:-500]
        super().notify(message, title=title, severity=severity, **kwargs)

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(signum, self._on_signal, signum)
                self._signals_installed.append(signum)
            except (RuntimeError, ValueError, NotImplementedError):
                pass

    def _on_signal(self, signum: int) -> None:
        if self.quitting:
            self.force_exit(130)
            return
        self.quit_worker = self.cancel_and_exit(130)

    def force_exit(self, return_code: int) -> None:
        """Leave without waiting for a job that ignores cancel (second signal, or q while quitting).

        The job's record stays "running" and later reads as interrupted, with
        every event written so far. The process ends right after the terminal
        is restored, because a stuck job thread would otherwise hold it open.
        """
        self._force_exit_code = return_code
        self.exit(return_code, return_code=return_code)

    # -- the host and the runtime -------------------------------------------------------
    @work(thread=True, exit_on_error=False, group="host-check",
          description="Scan the host: TPU chips, the TensorFlow build installed, the TPU's holder")
    def check_host(self) -> dict:
        if self._host_check_provider is not None:
            return self._host_check_provider().to_dict()
        from tpudash.hostcheck import inspect

        return inspect().to_dict()

    @work(thread=True, exit_on_error=False, group="runtime", exclusive=True,
          description="Detect the accelerator, connect, and build the distribution strategy")
    def detect_runtime(self, reinitialize: bool = False) -> Any:
        try:
            if self._runtime_provider is not None:
                runtime = self._runtime_provider()
            else:
                runtime = self._get_runtime(reinitialize)
        except BaseException as error:
            self._runtime_value, self._runtime_failure = None, error
            raise
        else:
            self._runtime_value, self._runtime_failure = runtime, None
            return runtime
        finally:
            self._runtime_ready.set()

    def _get_runtime(self, reinitialize: bool) -> Any:
        """``get_runtime(settings)``; after a failed automatic TPU attempt, the CPU default.

        The CLI starts a fresh process for the CPU default (TensorFlow is up,
        so this one can no longer split the CPU). A dashboard cannot start
        over under the user's feet, so until an engine process owns
        TensorFlow it takes the CPU default here, with the TPU left alone and
        the failure as the reason the Devices screen gives for "why not TPU".
        """
        from tpudash import runtime as runtime_module

        try:
            return runtime_module.get_runtime(self.settings, reinitialize=reinitialize)
        except runtime_module.TpuFallback as fallback:
            os.environ[runtime_module.FALLBACK_REASON_VARIABLE] = fallback.reason
            without_tpu = dataclasses.replace(self.settings, tpu=runtime_module.NO_TPU)
            return runtime_module.get_runtime(without_tpu, reinitialize=True)

    def _runtime_for_lane(self) -> Any:
        """The Runner's runtime provider: waits (on the job thread) for detection to finish."""
        self._runtime_ready.wait()
        if self._runtime_failure is not None:
            raise RuntimeError(f"the runtime could not be set up: {self._runtime_failure}")
        return self._runtime_value

    def action_reinitialize_runtime(self) -> None:
        if not self._runtime_ready.is_set():
            self.notify("The runtime is still being detected.", title="Runtime", severity="warning")
            return
        if self.runner.busy:
            self.notify("Cancel or finish the running job first.", title="Runtime in use", severity="warning")
            return
        self._runtime_ready.clear()
        self._runtime_value, self._runtime_failure = None, None
        self.runtime_settled.clear()
        # Errors first: screens redraw on ``runtime`` and show "connecting…" only without one.
        self.runtime_error = None
        self.tensorflow_missing = None
        self.runtime = None
        self.runtime_status = "connecting…"
        self.detect_runtime(reinitialize=True)

    def _runtime_detected(self, runtime: Any) -> None:
        # TensorFlow and Keras leave hundreds of thousands of long-lived
        # objects behind; every full collection walked them all (~230 ms
        # measured during training, a frozen UI each time). Frozen, they are
        # skipped: a full collection then takes ~40 ms. (Unfrozen first, so a
        # re-initialisation lets the previous runtime's objects be freed.)
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.runtime_settled.set()
        description = runtime.description
        simulated = " (simulated)" if getattr(description, "simulated", False) else ""
        self.runtime_status = f"{description.kind} · {description.strategy} · {description.num_replicas} replicas{simulated}"
        self.runtime_error = None
        self.tensorflow_missing = None
        self.runtime = runtime

    def _runtime_failed(self, error: BaseException | None) -> None:
        self.runtime_settled.set()
        missing = self._missing_tensorflow(error)
        if missing is not None:
            # Not a failure of the dashboard: everything but launching works.
            self.runtime_status = "no TensorFlow"
            self.tensorflow_missing = missing
            self.runtime_error = missing
            self.runtime = None
            self.notify(missing, title="No TensorFlow: jobs cannot run", severity="warning", timeout=15)
            return
        message = f"{type(error).__name__}: {error}" if error is not None else "unknown error"
        self.runtime_status = "runtime failed"
        self.runtime_error = message
        self.runtime = None
        self.notify(message, title="Runtime detection failed", severity="error", timeout=15)

    @staticmethod
    def _missing_tensorflow(error: BaseException | None) -> str | None:
        """The message of a ``TensorFlowMissing`` (it ends with the install line), else None."""
        if error is None:
            return None
        from tpudash.runtime import TensorFlowMissing

        return str(error) if isinstance(error, TensorFlowMissing) else None

    # -- workers --------------------------------------------------------------------
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if worker.group == "runtime":
            if event.state == WorkerState.SUCCESS:
                self._runtime_detected(worker.result)
            elif event.state == WorkerState.ERROR:
                self._runtime_failed(worker.error)
        elif worker.group == "jobs" and event.state in (WorkerState.SUCCESS, WorkerState.ERROR, WorkerState.CANCELLED):
            live = next((item for item in self.live_runs.values() if item.worker is worker), None)
            if live is not None:
                self._run_ended(live, worker)
        elif worker.group == "host-check" and event.state == WorkerState.SUCCESS:
            self.host_check = worker.result
        elif worker.group == "device-check" and event.state == WorkerState.SUCCESS and worker.result:
            if self.device_check is None:
                self.device_check = worker.result
        elif event.state == WorkerState.ERROR and worker.group not in ("jobs", "runtime"):
            self.notify(f"{type(worker.error).__name__}: {worker.error}", title=worker.description or worker.name,
                        severity="error")

    @work(thread=True, exit_on_error=False, group="jobs", description="Run a job on the accelerator lane")
    def execute_run(self, queued: QueuedRun) -> QueuedRun:
        return self.runner.execute(queued)

    def on_run_events_pending(self, message: RunEventsPending) -> None:
        live = self.live_runs.get(message.run_id)
        if live is not None and live.drain():
            self._lane_changed()

    def _run_ended(self, live: LiveRun, worker: Worker) -> None:
        live.drain()
        model = live.model
        if worker.state == WorkerState.ERROR or not model.finished_state:
            # The runner turns every job outcome into RunFinished; getting here
            # means the lane itself broke. Show it like a failed job.
            error = worker.error
            model.status = "cancelled" if live.queued.state == "cancelled" else "failed"
            if error is not None and model.status == "failed":
                model.error = f"{type(error).__name__}: {error}"
                model.traceback = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            model.finished = model.finished or time.time()
            model.version += 1
        duration = format_seconds(model.elapsed())
        if model.status == "done":
            self.notify(f"{model.job} done in {duration}", title="Run finished")
        elif model.status == "failed":
            self.notify(model.error or "failed", title=f"{model.job} failed", severity="error", timeout=10)
        elif model.status == "cancelled":
            self.notify(f"{model.job} cancelled after {duration}", title="Run cancelled", severity="warning")
        results = model.device_results()
        if results:
            self.device_check = {"run_id": model.run_id, "job": model.job, "finished": model.finished,
                                 "status": model.status, "results": results}
        live.settled.set()
        self._lane_changed()

    def _start_next_run(self) -> None:
        """Give the oldest waiting run a thread worker once the lane is free.

        Workers share a small thread pool (cores + 4); a worker per queued run
        blocking in ``runner.execute`` would starve History and the runtime of
        threads, so a run gets its worker only when it can start.
        """
        if self.active_live_run is not None:
            return
        for live in self.live_runs.values():
            if live.worker is None and not live.queued.done_event.is_set():
                live.worker = self.execute_run(live.queued)
                return

    def _settle_cancelled_while_queued(self) -> None:
        """Runs cancelled before their turn never get a worker; end them here."""
        for live in self.live_runs.values():
            if live.worker is None and live.queued.done_event.is_set() and not live.settled.is_set():
                live.model.status = "cancelled"
                live.model.finished = live.queued.finished or time.time()
                live.model.version += 1
                live.settled.set()
                self.notify(f"{live.model.job} removed from the queue before it started", title="Run cancelled",
                            severity="warning")

    def refresh_lane(self) -> None:
        """Something changed on the lane (a cancel, a launch): settle, start the next, redraw."""
        self._lane_changed()

    def _lane_changed(self) -> None:
        if self._runner is not None:
            self._settle_cancelled_while_queued()
            if not self.quitting:
                self._start_next_run()
        waiting = self.runner.queued()
        for live in self.live_runs.values():
            live.queue_position = waiting.index(live.queued) + 1 if live.queued in waiting else 0
        self.lane_version += 1
        self._update_lane_status()
        self._sync_active_screen(force=True)

    # -- launching ------------------------------------------------------------------
    def launch(self, spec: Any, params: dict, *, show: bool = True) -> LiveRun | None:
        """Queue ``spec`` with validated ``params`` and run it in a thread worker."""
        if self.quitting:
            return None
        # Read from the detection worker's own record, not the reactive: it is
        # set before the UI hears of the failure, so a key pressed in between
        # is refused too. Refused here, nothing reaches the runner, so no run
        # directory or failed record is made for a job that could never start.
        missing = self._missing_tensorflow(self._runtime_failure)
        if missing is not None:
            self.notify(missing, title=f"{spec.name} not launched: no TensorFlow", severity="error", timeout=15)
            return None
        if len(self.runner.queued()) >= MAX_WAITING_RUNS:
            self.notify(f"{MAX_WAITING_RUNS} runs are already waiting; cancel one or wait.",
                        title="Queue full", severity="warning")
            return None
        from tpudash.runmodel import RunModel

        model = RunModel(job=spec.name, params=params, status="queued")
        live = LiveRun(self, model)
        queued = self.runner.submit(spec, params, sinks=[live.sink])
        live.attach(queued)
        self.live_runs[queued.run_id] = live
        self._forget_old_runs()
        self.shown_run_id = queued.run_id
        busy = self.active_live_run
        self._lane_changed()
        if busy is not None:
            self.notify(f"{spec.name} queued behind {busy.model.job}", title="Queued")
        if show:
            self.call_later(self.action_show, "run")
        return live

    def launch_by_name(self, name: str, overrides: Mapping[str, Any] | None = None) -> LiveRun | None:
        from jobs.base import ParamError

        spec = self.job_specs.get(name)
        if spec is None:
            self.notify(f"job {name!r} is not installed; available: {', '.join(self.job_specs)}",
                        title="Unknown job", severity="error")
            return None
        try:
            params = spec.resolve(overrides or {})
            if self.runtime is not None and spec.check_runtime is not None:
                spec.check_runtime(params, self.runtime)
        except ParamError as error:
            self.notify(str(error), title=f"{name}: bad params", severity="error")
            return None
        return self.launch(spec, params)

    def _forget_old_runs(self) -> None:
        finished = [run_id for run_id, live in self.live_runs.items() if live.settled.is_set()]
        for run_id in finished[: max(0, len(self.live_runs) - MAX_SESSION_RUNS)]:
            del self.live_runs[run_id]

    # -- actions --------------------------------------------------------------------
    async def action_show(self, mode: str) -> None:
        if mode not in MODE_SCREENS:
            return
        if self.screen.is_modal:
            # A dialog or the palette is open in this mode; switching away would
            # strand it there (and a second palette would clash with it).
            return
        if self.current_mode != mode:
            self._previous_mode = self.current_mode
            self._instant_switch = mode in self._visited_modes
            try:
                await self.switch_mode(mode)
            finally:
                self._instant_switch = False
            self._visited_modes.add(mode)

    def delay_update(self, delay: float = 0.05) -> None:
        # Textual holds every frame for 50 ms after a mode switch, to hide a
        # screen that is still composing. A screen shown before is already
        # composed and kept, so it can be drawn at the next frame: that
        # 50 ms was most of a key's latency.
        if self._instant_switch:
            return
        super().delay_update(delay)

    async def action_back(self) -> None:
        await self.action_show(self._previous_mode if self._previous_mode != self.current_mode else "devices")

    def action_launch_job(self, name: str) -> None:
        self.launch_by_name(name)

    async def action_open_form(self, name: str) -> None:
        await self.action_show("jobs")
        select_job = getattr(self.screen, "select_job", None)
        if select_job is not None:
            select_job(name)

    def action_cancel_job(self) -> None:
        """Cancel the job on the lane (or about to start on it); else the last one queued."""
        active = self.active_live_run
        run = active.queued if active is not None else self.runner.current
        if run is None:
            waiting = self.runner.queued()
            if not waiting:
                self.notify("No job is running.", severity="warning")
                return
            run = waiting[-1]
        self.runner.cancel(run)
        self.notify(f"Cancelling {run.job}…", title="Cancel")
        self._lane_changed()

    async def action_quit(self) -> None:
        """Quit; while a job runs or waits, ask first (yes cancels, waits, records, exits)."""
        if self.quitting:
            self.force_exit(130)
            return
        if not self.runner.busy:
            self.exit(0)
            return
        from screens.dialogs import ConfirmScreen

        if isinstance(self.screen, ConfirmScreen):
            return  # already asking (ctrl+q reaches here past the dialog)
        current = self.runner.current
        what = f"{current.job} is running" if current is not None else "runs are waiting"
        waiting = len(self.runner.queued())
        question = f"{what}{f' and {waiting} more wait' if current is not None and waiting else ''}. " \
                   "Quitting cancels it and records it as cancelled."
        self.push_screen(ConfirmScreen(question, yes="Cancel and quit", no="Keep running"), self._quit_answered)

    def _quit_answered(self, yes: bool | None) -> None:
        if yes:
            self.quit_worker = self.cancel_and_exit(0)

    @work(exclusive=True, group="quit", exit_on_error=False, description="Cancel every run, wait until recorded, exit")
    async def cancel_and_exit(self, return_code: int = 0) -> None:
        self.quitting = True
        self.runner.cancel_all()
        self._lane_changed()
        self.notify("Cancelling the running job, then quitting… (q again: quit without waiting)", title="Quit")
        workers = [live.worker for live in self.live_runs.values() if live.worker is not None and not live.worker.is_finished]
        if workers:
            await asyncio.gather(*(worker.wait() for worker in workers), return_exceptions=True)
        for live in self.live_runs.values():
            live.drain()
        self.exit(return_code, return_code=return_code)

    # -- the timer --------------------------------------------------------------------
    def _tick(self) -> None:
        for live in self.live_runs.values():
            if live.drain():
                self._lane_changed()
        beat = display_beat()
        if beat != self._beat:
            self._beat = beat
            self._update_lane_status()
        self._sync_active_screen()
        ticked, self._tick_event = self._tick_event, asyncio.Event()
        ticked.set()

    async def next_tick(self) -> None:
        """Wait until the UI's timer has drained events and redrawn once more (tests, benchmarks)."""
        await self._tick_event.wait()

    def _sync_active_screen(self, force: bool = False) -> None:
        if self.exiting or not self.is_running:
            return  # widgets are being closed (exit, or a test's shutdown); nothing to draw on
        try:
            screen = self.screen
        except ScreenStackError:
            return
        tick = getattr(screen, "tick", None)
        if tick is not None:
            tick(force) if force else tick()

    def _update_lane_status(self) -> None:
        if self._runner is None:
            return  # nothing launched yet
        live = self.current_live_run
        waiting = len(self.runner.queued())
        if live is not None:
            model = live.model
            clock = format_seconds(model.elapsed(), precise=False)
            text = f"{model.job} ● {model.status} {clock}"
            if live.queued.cancel_event.is_set() and model.status == "running":
                text = f"{model.job} ● cancelling {clock}"
        else:
            last = next((item for item in reversed(self.live_runs.values()) if item.model.finished_state), None)
            text = f"last: {last.model.job} {last.model.status} ({format_seconds(last.model.elapsed())})" if last else "idle"
        if waiting:
            text += f" · {waiting} queued"
        self.lane_status = text

    # -- the last device check ------------------------------------------------------------
    @work(thread=True, exit_on_error=False, group="device-check", description="Find the last matmul check on disk")
    def load_last_device_check(self) -> dict | None:
        from tpudash.runmodel import RunModel

        for info in reversed(self.store.list_runs()):
            if info.job != "matmul" or info.status not in ("done", "failed"):
                continue
            data = self.store.load(info.run_id)
            model = RunModel.from_events(data.events, run_id=info.run_id, job=info.job)
            results = model.device_results()
            if results:
                return {"run_id": info.run_id, "job": info.job, "finished": info.finished,
                        "status": info.status, "results": results}
        return None


def _process_start_time() -> float | None:
    """When this process started (unix time, 10 ms resolution), from /proc."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return None


def run_app(settings: Settings, **options: Any) -> int:
    """Build the app and run it in the terminal; returns the exit code."""
    options.setdefault("redirect_stderr", os.environ.get("TPUDASH_NATIVE_STDERR") != "terminal")
    options.setdefault("handle_signals", True)
    app = TpudashApp(settings, **options)
    app.run()
    if os.environ.get(FIRST_FRAME_ENV) and app.first_frame_at is not None:
        started = _process_start_time()
        since_start = f"{app.first_frame_at - started:.3f}" if started is not None else "unknown"
        print(f"first_frame_unix={app.first_frame_at:.6f} since_process_start={since_start} "
              f"tensorflow_imported={app.tensorflow_imported_at_first_frame}")
    return app.return_code or 0
