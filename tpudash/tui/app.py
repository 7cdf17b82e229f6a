"""The Textual app shell: modes, key bindings, the session's lane, and the signals.

The dashboard never imports TensorFlow. An engine process (``python -m tpudash.engine``)
owns it and the accelerator; ``tpudash.engine.lane.Lane`` queues this session's runs,
starts the engine on first need (the Devices screen or a launch), sends it
one run at a time and follows each run by tailing its events.jsonl, as any
run on disk is read. The lane reports on the UI thread, through ``poll`` on
the app's timer; the app turns that into reactives the screens watch, and
notifications.

The first frame appears before anything heavy is imported: screens load when
their mode is first shown; the host check (chips, installed TensorFlow build,
the TPU's holder; no TensorFlow) runs after the first frame and the Devices
screen shows it long before the engine answers. Without TensorFlow the app
stays usable (Devices, Jobs, History, help) and refuses launches with the
install line. While the TUI runs, file descriptor 2 goes to the session log,
which the engine's stderr (TensorFlow's C++ logs) joins.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from textual import events, work
from textual.app import App, ScreenStackError
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.worker import Worker, WorkerState

from tpudash.tui.modes import MODE_SCREENS
from screens.base import DisplayTick
from tpudash.format import display_beat, format_seconds
from tpudash.config import Settings
from tpudash.tui.palette import TpudashCommands
from tpudash.tui.seams import UndelayedRevisits, guard_option_list_page_keys

if TYPE_CHECKING:  # the lane, records and host check load after the first frame
    from textual.screen import Screen

    from tpudash.engine.handle import EngineHandle, Listener
    from tpudash.engine.protocol import RuntimeFailed
    from tpudash.runs.follow import RunsDirectoryWatch, RunsScan
    from tpudash.accel.hostcheck import HostCheck
    from tpudash.runs.store import RunInfo
    from tpudash.engine.lane import Lane, LiveRun
    from tpudash.runs.store import RunStore

# How many runs may wait for the lane: a longer queue is more likely a key
# held down than a plan, and each waiting run is one more to cancel on quit.
MAX_WAITING_RUNS = 4
# Runs of this session kept in memory for the run view (their models are bounded).
MAX_SESSION_RUNS = 50
# How often the runs directory is looked at for runs started elsewhere (a notebook's fit).
RUNS_SCAN_SECONDS = 1.0
TICK_SECONDS = 0.1
FIRST_FRAME_ENV = "TPUDASH_EXIT_AFTER_FIRST_FRAME"


def _screen_factory(module_name: str, class_name: str) -> Callable[[], Any]:
    """A MODES entry that imports its screen module only when the mode is first shown."""

    def make_screen():
        return getattr(importlib.import_module(module_name), class_name)()

    make_screen.__name__ = f"make_{class_name}"
    return make_screen


class LaneMessagesPending(Message):
    """The engine said something (a run started or ended, the runtime): poll the lane."""


class HostChecked(Message):
    """The host scan finished (posted from its worker thread)."""

    def __init__(self, report: dict):
        super().__init__()
        self.report = report


class DeviceCheckFound(Message):
    """The last matmul check on disk, for the Devices screen (posted from its worker thread)."""

    def __init__(self, check: dict):
        super().__init__()
        self.check = check


class RunsScanned(Message):
    """A look into the runs directory ended: what it found, or why it could not read it."""

    def __init__(self, scan: RunsScan | None, error: Exception | None = None):
        super().__init__()
        self.scan = scan
        self.error = error


class TelemetrySampled(Message):
    """The sampler took a telemetry sample (posted from its thread)."""

    def __init__(self, stamp: float, sample: Any):
        super().__init__()
        self.stamp = stamp
        self.sample = sample


class TpudashApp(UndelayedRevisits, App[int]):
    """tpudash: devices, jobs, live runs and history of a TensorFlow accelerator session."""

    CSS_PATH = "app.tcss"
    TITLE = "tpudash"
    MODES = {mode: _screen_factory(module, cls) for mode, (module, cls, _, _) in MODE_SCREENS.items()}
    DEFAULT_MODE = "devices"
    COMMANDS = App.COMMANDS | {TpudashCommands}
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (40, "-tall")]
    # The keys design.md makes a contract (tests outside the project drive
    # them): the keys line shows every one of them, even at 80 columns.
    CONTRACT_KEYS = frozenset({"d", "j", "h", "question_mark", "q", "m", "r", "g", "t", "c", "enter", "ctrl+p"})
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
        Binding("g", "launch_job('gradient-descent')", "Gradient", id="tpudash.gradient_descent",
                tooltip="run the gradient descent example (default params)"),
        Binding("t", "open_form('train')", "Train", id="tpudash.train", tooltip="open the train form; enter launches"),
        Binding("c", "cancel_job", "Cancel", id="tpudash.cancel", tooltip="cancel the running job"),
        Binding("w", "watch_live", "Watch", id="tpudash.watch", show=False,
                tooltip="open the newest live run: your own model.fit with TpudashCallback, tpudash.record, "
                        "or a run in another terminal"),
        Binding("E", "release_engine", "Release", id="tpudash.release", show=False,
                tooltip="release the accelerator: the engine exits so another process can take the TPU"),
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
    engine_status: reactive[str] = reactive("none", repaint=False)
    """The engine's state for the session bar: none, starting…, ready on KIND, running JOB, released, crashed."""
    lane_status: reactive[str] = reactive("idle", repaint=False)
    """One line about the accelerator lane: the running job, its status and time, the queue."""
    runtime: reactive[Any] = reactive(None, always_update=True, repaint=False)
    """The engine's runtime as the dashboard sees it (``Runtime.from_description``: no strategy), or None."""
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
    runs_version: reactive[int] = reactive(0, repaint=False)
    """Bumped when the runs directory gains or loses a run, or a live run changes (History redraws)."""
    telemetry: reactive[Any] = reactive(None, always_update=True, repaint=False)
    """The newest telemetry sample as (time, ``jobs.events.Telemetry``), or None before the first."""

    def __init__(
        self,
        settings: Settings | None = None,
        runtime_provider: Callable[[], Any] | None = None,
        *,
        host_check_provider: Callable[[], HostCheck] | None = None,
        engine_factory: Callable[[Listener], EngineHandle] | None = None,
        job_specs: Mapping[str, Any] | None = None,
        redirect_stderr: bool = False,
        handle_signals: bool = False,
    ):
        """``runtime_provider`` runs the engine on a thread of this process with that runtime
        (tests whose jobs live in the test); otherwise the engine is a process.

        ``host_check_provider`` replaces ``tpudash.accel.hostcheck.inspect`` (tests pass a TPU host).
        ``engine_factory`` replaces how an engine is started; ``job_specs`` the job registry.
        ``redirect_stderr`` sends fd 2 to the session log while the app runs
        (off by default so tests keep pytest's capture); ``handle_signals``
        makes SIGTERM/SIGINT cancel the running job cleanly, then exit.
        """
        super().__init__()
        guard_option_list_page_keys()  # see tpudash/textual_seams.py
        self.settings = settings or Settings.load()
        self._runtime_provider = runtime_provider
        self._host_check_provider = host_check_provider
        self._engine_factory = engine_factory
        self._job_specs = dict(job_specs) if job_specs is not None else None
        self.redirect_stderr = redirect_stderr
        self.handle_signals = handle_signals
        self._store: RunStore | None = None
        self._lane: Lane | None = None
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
        self._previous_mode = self.DEFAULT_MODE
        self._signals_installed: list[int] = []
        self.runtime_settled = asyncio.Event()
        """Set when the engine has answered about the runtime (runtime or error)."""
        self._tick_event = asyncio.Event()
        self._redraw_budget = None
        self._beat = 0
        self._poll_posted = False
        self._runs_watch: RunsDirectoryWatch | None = None
        self._runs_scan_worker: Worker | None = None
        self._runs_scan_failed = False
        self.live_on_disk: list[RunInfo] = []
        """Live runs in the runs directory at the last look (any writer), newest first."""
        self.telemetry_loop: Any = None
        """The ``SamplingLoop`` behind ``telemetry`` (None until started, or when sampling is off)."""
        self._telemetry_targets: tuple[tuple[Path, ...], dict[str, int]] = ((), {})

    # -- properties -----------------------------------------------------------------
    @property
    def runs_dir(self) -> Path:
        from tpudash.config import default_runs_dir

        return Path(self.settings.runs_dir or default_runs_dir(os.environ))

    @property
    def store(self) -> "RunStore":
        """The runs directory (created on first use, after the first frame)."""
        if self._store is None:
            from tpudash.runs.store import RunStore

            self._store = RunStore(self.runs_dir)
        return self._store

    @property
    def lane(self) -> "Lane":
        """The session's runs and the engine that executes them (made on first use)."""
        if self._lane is None:
            from tpudash.engine.lane import Lane

            self._lane = Lane(self.store, self._start_engine, self, self._wake_for_lane,
                              cancel_grace=self.settings.cancel_grace, release_after=self.settings.release_after,
                              keep_runs=MAX_SESSION_RUNS)
        return self._lane

    @property
    def live_runs(self) -> dict[str, LiveRun]:
        """This session's runs by id, in launch order (the lane keeps the last ``MAX_SESSION_RUNS``)."""
        return {live.run_id: live for live in self._lane.runs} if self._lane is not None else {}

    @property
    def redraw_budget(self) -> Any:
        """The ``RedrawBudget`` every plot of this app shares."""
        if self._redraw_budget is None:
            from tpudash.tui.plots import RedrawBudget

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
    def current_live_run(self) -> LiveRun | None:
        """The run the engine has now, if any."""
        return self._lane.current if self._lane is not None else None

    @property
    def engine_pid(self) -> int | None:
        """The pid of the engine process that owns TensorFlow now (None when there is none)."""
        engine = self._lane.engine if self._lane is not None else None
        return engine.pid if engine is not None else None

    @property
    def busy(self) -> bool:
        """A run is running or waiting."""
        return self._lane is not None and self._lane.busy

    # -- the engine -------------------------------------------------------------------
    def _start_engine(self, listener: Listener) -> EngineHandle:
        if self._engine_factory is not None:
            return self._engine_factory(listener)
        if self._runtime_provider is not None:
            from tpudash.engine.handle import EngineThread

            return EngineThread(listener, self.settings, self.job_specs, self._runtime_provider)
        from tpudash.engine.handle import EngineProcess
        from tpudash.accel.nativelog import session_log_path

        self.store.root.mkdir(parents=True, exist_ok=True)
        log_path = self.session_log.log_path if self.session_log is not None else session_log_path(self.runs_dir)
        return EngineProcess(listener, self.settings, log_path)

    def _wake_for_lane(self) -> None:
        """An engine message arrived (on a reader thread): poll the lane now rather than at the next tick."""
        if not self._poll_posted:
            self._poll_posted = True
            self.post_message(LaneMessagesPending())  # thread-safe

    def on_lane_messages_pending(self, _message: LaneMessagesPending) -> None:
        self._poll_posted = False
        if self._lane is not None and self._lane.poll():
            self._lane_changed()

    def lane_runtime(self, description: dict) -> None:
        from tpudash.accel.description import Runtime

        runtime = Runtime.from_description(description)
        self.runtime_settled.set()
        simulated = " (simulated)" if runtime.description.simulated else ""
        self.runtime_status = (f"{runtime.description.kind} · {runtime.description.strategy} · "
                               f"{runtime.description.num_replicas} replicas{simulated}")
        self.runtime_error = None
        self.tensorflow_missing = None
        self.runtime = runtime

    def lane_runtime_failed(self, failure: RuntimeFailed) -> None:
        self.runtime_settled.set()
        if failure.missing_tensorflow:
            # Not a failure of the dashboard: everything but launching works.
            missing = failure.message or failure.error
            self.runtime_status = "no TensorFlow"
            self.tensorflow_missing = missing
            self.runtime_error = missing
            self.runtime = None
            self.notify(missing, title="No TensorFlow: jobs cannot run", severity="warning", timeout=15)
            return
        error = failure.error or "unknown error"
        self.runtime_status = "runtime failed"
        self.runtime_error = error
        self.runtime = None
        self.notify(error, title="Runtime detection failed", severity="error", timeout=15)

    def lane_run_settled(self, live: LiveRun) -> None:
        model = live.model
        duration = format_seconds(model.elapsed())
        if live.run_id not in self.live_runs:
            return
        if model.status == "done":
            self.notify(f"{model.job} done in {duration}", title="Run finished")
        elif model.status == "failed":
            self.notify(model.error or "failed", title=f"{model.job} failed", severity="error", timeout=10)
        elif model.status == "cancelled" and model.started is None:
            self.notify(f"{model.job} removed from the queue before it started", title="Run cancelled",
                        severity="warning")
        elif model.status == "cancelled":
            self.notify(f"{model.job} cancelled after {duration}", title="Run cancelled", severity="warning")
        results = model.device_results()
        if results:
            self.device_check = {"run_id": model.run_id, "job": model.job, "finished": model.finished,
                                 "status": model.status, "results": results}

    def lane_engine_changed(self) -> None:
        self._update_engine_status()

    def _update_engine_status(self) -> None:
        lane = self._lane
        if lane is None:
            return
        status = lane.engine_line()
        if status != self.engine_status:
            from tpudash.engine.lane import ENGINE_CRASHED

            if lane.engine_state == ENGINE_CRASHED and lane.last_exit is not None:
                self.notify(f"{lane.last_exit.describe()}; the next launch starts a new one. "
                            "Its last lines are in the session log (l).",
                            title="Engine crashed", severity="error", timeout=15)
            self.engine_status = status

    # -- lifecycle ------------------------------------------------------------------
    def on_load(self) -> None:
        # Before the driver exists, so Textual draws on a private copy of the
        # terminal while fd 2 (TensorFlow's C++ logs, tqdm) goes to the log.
        if self.redirect_stderr:
            from tpudash.accel.nativelog import NativeStderr, session_log_path

            self.session_log = NativeStderr(session_log_path(self.runs_dir)).start()

    def on_mount(self) -> None:
        self.set_interval(TICK_SECONDS, self._tick, name="tpudash tick")
        if self.session_log is not None:
            # Python-level prints and warnings join the session log instead of
            # vanishing into Textual's capture.
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
        if self.current_mode == "devices":
            self._engine_needed()
        self.load_last_device_check()
        self.set_interval(RUNS_SCAN_SECONDS, self._scan_runs_directory, name="tpudash runs scan")
        self._scan_runs_directory()
        if self.settings.telemetry_interval:
            self.start_telemetry()

    def _engine_needed(self) -> None:
        """The Devices screen needs the runtime: start the engine unless it was ever started."""
        if not self.quitting:
            self.lane.ensure_engine()
            self._update_engine_status()

    def on_print(self, event: events.Print) -> None:
        try:
            os.write(2, event.text.encode("utf-8", errors="replace"))
        except OSError:
            pass

    def on_unmount(self) -> None:
        # However the app ends (quit, a crash, a test's shutdown), the engine
        # goes with it: it cancels its job, records it, and exits, releasing
        # the accelerator for the next process.
        if self._lane is not None:
            self._lane.close()
        if self.telemetry_loop is not None:
            self.telemetry_loop.stop()
        for signum in self._signals_installed:
            try:
                asyncio.get_running_loop().remove_signal_handler(signum)
            except (RuntimeError, ValueError):
                pass

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
        """Leave without waiting for the cancel to be recorded (second signal, or q while quitting).

        The engine is released as the app unmounts: it cancels and records
        its job on its own, after the dashboard has gone.
        """
        self.exit(return_code, return_code=return_code)

    # -- the host and the runtime -------------------------------------------------------
    @work(thread=True, exit_on_error=False, group="host-check",
          description="Scan the host: TPU chips, the TensorFlow build installed, the TPU's holder")
    def check_host(self) -> None:
        if self._host_check_provider is not None:
            report = self._host_check_provider().to_dict()
        else:
            from tpudash.accel.hostcheck import inspect

            report = inspect().to_dict()
        self.post_message(HostChecked(report))

    def action_reinitialize_runtime(self) -> None:
        """A new engine: TensorFlow and the accelerator set up from scratch."""
        refused = self.lane.restart_engine()
        if refused is not None:
            self.notify(f"{refused[0].upper()}{refused[1:]}.", title="Runtime in use", severity="warning")
            return
        self.runtime_settled.clear()
        # Errors first: screens redraw on ``runtime`` and show "connecting…" only without one.
        self.runtime_error = None
        self.tensorflow_missing = None
        self.runtime = None
        self.runtime_status = "connecting…"
        self._update_engine_status()

    def action_release_engine(self) -> None:
        """Release the accelerator: the engine exits, so a notebook or another process can take the TPU."""
        refused = self.lane.release()
        if refused is not None:
            self.notify(f"Not released: {refused}.", title="Release the accelerator", severity="warning")
            return
        self.notify("The engine exited; the accelerator is free. The next launch starts a new engine.",
                    title="Accelerator released")
        self._update_engine_status()

    # -- workers --------------------------------------------------------------------
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if event.state == WorkerState.ERROR:
            self.notify(f"{type(worker.error).__name__}: {worker.error}", title=worker.description or worker.name,
                        severity="error")

    def on_host_checked(self, message: HostChecked) -> None:
        self.host_check = message.report

    def on_device_check_found(self, message: DeviceCheckFound) -> None:
        if self.device_check is None:  # a check run in this session came first
            self.device_check = message.check

    def refresh_lane(self) -> None:
        """Something changed on the lane (a cancel, a launch): redraw."""
        self._lane_changed()

    def _lane_changed(self) -> None:
        self._aim_telemetry()
        self.lane_version += 1
        self._update_engine_status()
        self._update_lane_status()
        self._sync_active_screen(force=True)

    # -- launching ------------------------------------------------------------------
    def launch(self, spec: Any, params: dict, *, show: bool = True) -> LiveRun | None:
        """Queue ``spec`` with validated ``params``; the engine runs it when the lane is free."""
        if self.quitting:
            return None
        if self.tensorflow_missing is not None:
            # Refused here, nothing reaches the engine, so no run directory or
            # failed record is made for a job that could never start.
            self.notify(self.tensorflow_missing, title=f"{spec.name} not launched: no TensorFlow", severity="error",
                        timeout=15)
            return None
        if len(self.lane.waiting) >= MAX_WAITING_RUNS:
            self.notify(f"{MAX_WAITING_RUNS} runs are already waiting; cancel one or wait.",
                        title="Queue full", severity="warning")
            return None
        busy = self.lane.current
        live = self.lane.launch(spec, params)
        self.shown_run_id = live.run_id
        self._lane_changed()
        if busy is not None:
            self.notify(f"{spec.name} queued behind {busy.job}", title="Queued")
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

    def cancel_run(self, live: LiveRun) -> None:
        """Cancel one session run: a queued one leaves the queue; a running one stops within the grace period."""
        self.lane.cancel(live)
        self.notify(f"Cancelling {live.job}…", title="Cancel")
        self._lane_changed()

    # -- actions --------------------------------------------------------------------
    async def action_show(self, mode: str) -> None:
        if mode not in MODE_SCREENS or self.exiting:
            return
        if self.screen.is_modal:
            # A dialog or the palette is open in this mode; switching away would
            # strand it there (and a second palette would clash with it).
            return
        if mode == "devices" and self.first_frame_at is not None:
            self._engine_needed()
        if self.current_mode != mode:
            self._previous_mode = self.current_mode
            await self.switch_mode_undelayed(mode)

    async def action_back(self) -> None:
        await self.action_show(self._previous_mode if self._previous_mode != self.current_mode else "devices")

    def action_launch_job(self, name: str) -> None:
        self.launch_by_name(name)

    async def action_open_form(self, name: str) -> None:
        await self.action_show("jobs")
        from screens.jobs import JobsScreen

        if isinstance(self.screen, JobsScreen):  # not while a dialog is open over it
            await self.screen.open_form(name)

    def action_cancel_job(self) -> None:
        """Cancel the job on the lane; else the last one queued."""
        lane = self._lane
        live = lane.current if lane is not None else None
        if live is None:
            waiting = lane.waiting if lane is not None else []
            if not waiting:
                self.notify("No job is running.", severity="warning")
                return
            live = waiting[-1]
        self.cancel_run(live)

    async def action_quit(self) -> None:
        """Quit; while a job runs or waits, ask first (yes cancels, records, exits)."""
        if self.quitting:
            self.force_exit(130)
            return
        if not self.busy:
            self.exit(0)
            return
        from screens.dialogs import ConfirmScreen

        if isinstance(self.screen, ConfirmScreen):
            return  # already asking (ctrl+q reaches here past the dialog)
        current = self.lane.current
        what = f"{current.job} is running" if current is not None else "runs are waiting"
        waiting = len(self.lane.waiting)
        question = f"{what}{f' and {waiting} more wait' if current is not None and waiting else ''}. " \
                   "Quitting cancels it and records it as cancelled."
        self.push_screen(ConfirmScreen(question, yes="Cancel and quit", no="Keep running"), self._quit_answered)

    def _quit_answered(self, yes: bool | None) -> None:
        if yes:
            self.quit_worker = self.cancel_and_exit(0)

    @work(exclusive=True, group="quit", exit_on_error=False, description="Cancel every run, wait until recorded, exit")
    async def cancel_and_exit(self, return_code: int = 0) -> None:
        """Cancel, wait for the record (the lane ends the engine after the grace period), exit."""
        self.quitting = True
        if self._lane is not None:
            self._lane.stop()
            self._lane_changed()
            if not self._lane.stopped:
                self.notify("Cancelling the running job, then quitting… (q again: quit without waiting)", title="Quit")
            while not self._lane.stopped:
                await self.next_tick()
        self.exit(return_code, return_code=return_code)

    # -- the timer --------------------------------------------------------------------
    def _tick(self) -> None:
        if self._lane is not None and self._lane.poll():
            self._lane_changed()
        beat = display_beat()
        if beat != self._beat:
            self._beat = beat
            self._update_lane_status()
        screen = self._sync_active_screen()
        ticked, self._tick_event = self._tick_event, asyncio.Event()
        # Queued behind the tick, so next_tick() returns once the screen has redrawn.
        if screen is None or not screen.call_later(ticked.set):
            ticked.set()

    async def next_tick(self) -> None:
        """Wait until the UI's timer has read new events and redrawn once more (tests, benchmarks)."""
        await self._tick_event.wait()

    def _sync_active_screen(self, force: bool = False) -> Screen | None:
        """Tell the screen on show to redraw what changed; the screen told, if any."""
        if self.exiting or not self.is_running:
            return None  # widgets are being closed (exit, or a test's shutdown); nothing to draw on
        try:
            screen = self.screen
        except ScreenStackError:
            return None
        screen.post_message(DisplayTick(force))
        return screen

    def _update_lane_status(self) -> None:
        lane = self._lane
        if lane is None:
            return  # nothing launched yet
        live = lane.current
        waiting = len(lane.waiting)
        if live is not None and self.quitting:
            # Quit was confirmed: the job is being cancelled and the app exits once it is recorded.
            self.lane_status = f"stopping: cancelling {live.job}…"
            return
        if live is not None:
            model = live.model
            clock = format_seconds(model.elapsed(), precise=False)
            status = "cancelling" if live.cancelling else model.status if model.started else "starting"
            text = f"{model.job} ● {status} {clock}"
        else:
            last = next((item for item in reversed(self.live_runs.values()) if item.model.finished_state), None)
            text = f"last: {last.model.job} {last.model.status} ({format_seconds(last.model.elapsed())})" if last else "idle"
            if last is not None and last.model.error:
                text += f": {last.model.error}"
        if waiting:
            text += f" · {waiting} queued"
        self.lane_status = text

    # -- runs written elsewhere ------------------------------------------------------------
    def _scan_runs_directory(self) -> None:
        if self.exiting or (self._runs_scan_worker is not None and self._runs_scan_worker.is_running):
            return
        self._runs_scan_worker = self.scan_runs_directory()

    @work(thread=True, exit_on_error=False, group="runs-scan",
          description="Look in the runs directory for new runs and live runs from other processes")
    def scan_runs_directory(self) -> None:
        try:
            if self._runs_watch is None:
                from tpudash.runs.follow import RunsDirectoryWatch

                self._runs_watch = RunsDirectoryWatch(self.store)
            scan = self._runs_watch.scan()
        except Exception as error:  # an unreadable runs directory: said on the screen, the timer goes on
            self.post_message(RunsScanned(None, error))
            return
        self.post_message(RunsScanned(scan))

    def on_runs_scanned(self, message: RunsScanned) -> None:
        from tpudash.runs.follow import SOURCE_WORDS

        if message.error is not None:
            # Looked at every second: say it once, not every second.
            if not self._runs_scan_failed:
                self._runs_scan_failed = True
                self.notify(f"{type(message.error).__name__}: {message.error}",
                            title="Cannot read the runs directory", severity="error")
            return
        scan = message.scan
        self.live_on_disk = scan.live
        self._aim_telemetry()
        for info in scan.appeared_live:
            if info.run_id in self.live_runs:
                continue  # this session's own run: its Run view is already showing it
            writer = SOURCE_WORDS.get(info.source, info.source)
            self.notify(f"{info.job}, from {writer} in pid {info.pid}. Press w to watch it.",
                        title="A run is live", timeout=10)
        if scan.changed:
            self.runs_version += 1

    def action_watch_live(self) -> None:
        """Open the newest live run: a session run in the Run view, any other in its own live view."""
        if not self.live_on_disk:
            self.notify("No run is being written now. Train with TpudashCallback (or tpudash.record) and it "
                        "shows up here within a second.", title="Nothing live", severity="warning")
            return
        newest = self.live_on_disk[0]
        if newest.run_id in self.live_runs:
            self.shown_run_id = newest.run_id
            self.call_later(self.action_show, "run")
            return
        from screens.history import RunDetailScreen

        self.push_screen(RunDetailScreen(newest.run_id))

    # -- telemetry ------------------------------------------------------------------------------
    def start_telemetry(self) -> None:
        """Sample until the app ends; every live run gets the samples taken while it is live.

        A thread of its own, not a Textual worker: it runs as long as the app,
        and ``workers.wait_for_complete()`` (how callers wait for a job's
        worker) would otherwise never return.
        """
        from tpudash.telemetry.sampling import telemetry_sampler
        from tpudash.telemetry.sampling import SamplingLoop, TelemetryRecorder

        recorder = TelemetryRecorder()

        def on_sample(stamp: float, sample: Any) -> None:
            run_dirs, _ = self._telemetry_targets
            recorder.record(stamp, sample, run_dirs)
            self.post_message(TelemetrySampled(stamp, sample))

        def sample() -> None:
            # The PCI scan and psutil's first reading happen here, off the UI thread.
            self.telemetry_loop = loop = SamplingLoop(
                telemetry_sampler(self.settings), self.settings.telemetry_interval, on_sample,
                processes=lambda: self._telemetry_targets[1])
            try:
                if not self.exiting:  # else on_unmount may have come and gone before the loop existed
                    loop.run()
            finally:
                recorder.close()

        threading.Thread(target=sample, name="tpudash-telemetry", daemon=True).start()

    def on_telemetry_sampled(self, message: TelemetrySampled) -> None:
        self.telemetry = (message.stamp, message.sample)

    def _aim_telemetry(self) -> None:
        """Which runs are live now (this session's and any other process's on this host), and whose memory to show."""
        run_dirs = [self.store.root / info.run_id for info in self.live_on_disk]
        processes: dict[str, int] = {}
        current = self.current_live_run
        if current is not None:
            run_dirs.append(self.store.root / current.run_id)
        if self.engine_pid is not None:
            processes["engine"] = self.engine_pid
        writers = [info.pid for info in self.live_on_disk if info.pid not in (None, self.engine_pid)]
        if writers:
            processes["writer"] = writers[0]
        # One tuple, replaced whole: the sampling thread reads it without a lock.
        self._telemetry_targets = (tuple(dict.fromkeys(run_dirs)), processes)

    @property
    def telemetry_history(self) -> list[Any]:
        """The samples kept so far, oldest first: (time, Telemetry)."""
        # deque.copy is one C call: atomic against the sampling thread's appends.
        return list(self.telemetry_loop.sampler.history.copy()) if self.telemetry_loop is not None else []

    # -- the last device check ------------------------------------------------------------
    @work(thread=True, exit_on_error=False, group="device-check", description="Find the last matmul check on disk")
    def load_last_device_check(self) -> None:
        from tpudash.runs.model import RunModel

        for info in reversed(self.store.list_runs()):
            if info.job != "matmul" or info.status not in ("done", "failed"):
                continue
            data = self.store.load(info.run_id)
            model = RunModel.from_events(data.events, run_id=info.run_id, job=info.job)
            results = model.device_results()
            if results:
                self.post_message(DeviceCheckFound({"run_id": info.run_id, "job": info.job, "finished": info.finished,
                                                    "status": info.status, "results": results}))
                return


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
