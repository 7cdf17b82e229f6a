"""The Textual app shell: modes, key bindings, actions, the timer, and the app's reactives the screens watch.

The dashboard never imports TensorFlow. An engine process (``python -m tpudash.engine``)
owns it and the accelerator; the session (``tpudash.tui.session.DashboardSession``,
Textual-free) queues this session's runs on its lane, starts the engine on
first need (the Devices screen or a launch), follows each run by tailing its
events.jsonl as any run on disk is read, and says what it learns through this
app's reactives and notifications. The app reads the lane on its UI timer.

The first frame appears before anything heavy is imported: screens load when
their mode is first shown; the host check (chips, installed TensorFlow build,
the TPU's holder; no TensorFlow) runs after the first frame and the Devices
screen shows it long before the engine answers. The Devices screen's need
for the engine waits for that check: the engine runs on the framework the
settings resolve to (TensorFlow where installed, else JAX; ``--framework``
and the palette choose), and without it no engine starts, the app stays
usable (Devices, Jobs, History, help) and refuses launches with the
install line(s); beside another process that holds the TPU (a JAX
script, a notebook) no engine starts either, and a launch asks to run on
the CPU instead (``tpudash.tui.hostgate``). While the TUI runs, file descriptor 2 goes to the session log
(``tpudash.tui.hostio``), which the engine's stderr (TensorFlow's C++ logs) joins.

The app is assembled from mixins, one job each: ``tpudash.tui.ticks`` (the UI
timer, ``next_tick``), ``tpudash.tui.background`` (what starts after the first
frame: the host check, the runs scan, screens built ahead), ``tpudash.tui.quitting``
(q and the stop signals), ``tpudash.tui.seams`` (Textual's mode switch without
its hold) and ``tpudash.tui.view`` (the reactives). This module keeps the keys,
the modes, the lifecycle and the actions.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from textual import events
from textual.app import App
from textual.binding import Binding

from tpudash.config import Settings
from tpudash.tui import collector
from tpudash.tui.background import AfterFirstFrame
from tpudash.tui.hostio import HostIO
from tpudash.tui.modes import MODE_SCREENS, mode_screen_factories, run_detail_screen
from tpudash.tui.palette import TpudashCommands
from tpudash.tui.quitting import QuitFlow
from tpudash.tui.seams import (
    CollectsAfterFrames,
    UndelayedRevisits,
    guard_option_list_page_keys,
    guard_select_mount_while_taken_down,
)
from tpudash.tui.session import DashboardSession, EngineFactory
from tpudash.tui.ticks import TICK_SECONDS, UITicks
from tpudash.tui.view import DashboardView

if TYPE_CHECKING:  # the host check loads after the first frame
    from jobs.base import JobSpec
    from tpudash.accel.hostcheck import HostCheck

__all__ = ["TICK_SECONDS", "TpudashApp", "run_app"]

FIRST_FRAME_ENV = "TPUDASH_EXIT_AFTER_FIRST_FRAME"


# Each mixin one job (see the docstring); all before App, UndelayedRevisits last (the only order mypy accepts).
class TpudashApp(QuitFlow, AfterFirstFrame, UITicks, CollectsAfterFrames, UndelayedRevisits, DashboardView):
    """tpudash: devices, jobs, live runs and history of a TensorFlow accelerator session."""

    CSS_PATH = "app.tcss"
    TITLE = "tpudash"
    MODES = mode_screen_factories()
    DEFAULT_MODE = "devices"
    COMMANDS = App.COMMANDS | {TpudashCommands}
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (40, "-tall")]
    # The keys design.md makes a contract (tests outside the project drive
    # them): the keys line shows every one of them, even at 80 columns.
    CONTRACT_KEYS = frozenset({"d", "j", "h", "n", "question_mark", "q", "m", "r", "g", "t", "c", "enter", "ctrl+p"})
    # fmt: off
    # One binding a line: the table reads as the keys line and help do.
    BINDINGS = [
        Binding("d", "show('devices')", "Devices", id="tpudash.devices",
                tooltip="the runtime, strategy, topology and logical devices"),
        Binding("j", "show('jobs')", "Jobs", id="tpudash.jobs", tooltip="every job with a form of its params"),
        Binding("h", "show('history')", "History", id="tpudash.history",
                tooltip="past runs: open one, overlay two, export CSV"),
        Binding("v", "show('run')", "Run", id="tpudash.run", tooltip="the live view of this session's runs"),
        Binding("n", "show('hosts')", "Hosts", id="tpudash.hosts",
                tooltip="every host running tpudash agent: its chips, CPU, memory and heartbeat"),
        Binding("m", "launch_job('matmul')", "Matmul", id="tpudash.matmul",
                tooltip="run the matmul check on every device (default params)"),
        Binding("r", "launch_job('replica-matmul')", "Replicas", id="tpudash.replica_matmul",
                tooltip="run strategy.run(matmul) on every replica (default params)"),
        Binding("g", "launch_job('gradient-descent')", "Gradient", id="tpudash.gradient_descent",
                tooltip="run the gradient descent example (default params)"),
        Binding("t", "open_form('train')", "Train", id="tpudash.train", tooltip="open the train form; enter launches"),
        Binding("c", "cancel_job", "Cancel", id="tpudash.cancel", tooltip="cancel the running job"),
        Binding("w", "watch_live", "Watch", id="tpudash.watch",
                tooltip="open the newest live run: your own model.fit with TpudashCallback, tpudash.record, "
                        "or a run in another terminal"),
        Binding("E", "release_engine", "Release", id="tpudash.release",
                tooltip="release the accelerator: the engine exits so another process can take the TPU"),
        Binding("l", "show('log')", "Log", id="tpudash.log",
                tooltip="the session log (TensorFlow's native output) and notifications"),
        Binding("question_mark", "show('help')", "Help", id="tpudash.help", key_display="?",
                tooltip="keys and what tpudash keeps"),
        Binding("q", "quit", "Quit", id="tpudash.quit", tooltip="quit (asks first while a job runs)"),
    ]
    # fmt: on

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        engine_factory: EngineFactory | None = None,
        host_check_provider: Callable[[], HostCheck] | None = None,
        job_specs: Mapping[str, JobSpec] | None = None,
        redirect_stderr: bool = False,
        handle_signals: bool = False,
        freeze_after_start: bool = False,
    ):
        """``engine_factory`` replaces how an engine is started (tests run ``tpudash.engine.inthread.EngineThread``
        with their own jobs); otherwise the engine is a process.

        ``host_check_provider`` replaces ``tpudash.accel.hostcheck.inspect`` (tests pass a TPU host),
        ``job_specs`` the job registry. ``redirect_stderr`` sends fd 2 to the session log while the app
        runs (off by default so tests keep pytest's capture); ``handle_signals`` makes SIGTERM/SIGINT
        cancel the running job cleanly, then exit. ``freeze_after_start``: once every screen is built,
        what the process holds is frozen out of the collector's way and full collections made rare
        (``tpudash.tui.collector``), as a dashboard's own process does; not in a process that makes many
        apps (tests): unfrozen at each app's end, the whole heap would come back to the collector's oldest
        generation every time.
        """
        super().__init__()
        self.freeze_after_start = freeze_after_start
        guard_option_list_page_keys()  # see tpudash/tui/seams.py
        guard_select_mount_while_taken_down()
        self.settings = settings or Settings.load()
        self.session = DashboardSession(
            self.settings,
            self,
            engine_factory=engine_factory,
            job_specs=job_specs,
            host_check_provider=host_check_provider,
        )
        self.host_io = HostIO(redirect_stderr, handle_signals)
        self.first_frame_at: float | None = None
        """Unix time of the first frame (``TPUDASH_EXIT_AFTER_FIRST_FRAME`` prints it)."""
        self.tensorflow_imported_at_first_frame: bool | None = None
        self.modules_at_first_frame: list[str] = []
        """What the process had imported at its first frame (kept with ``TPUDASH_EXIT_AFTER_FIRST_FRAME``)."""
        self._previous_mode = self.DEFAULT_MODE
        self._screens_asked = 0
        """How many times a screen was asked for (a key, the palette): a deferred Run view yields to a later ask."""

    # -- lifecycle ------------------------------------------------------------------
    def on_load(self) -> None:
        # Before the driver exists, so Textual draws on a private copy of the
        # terminal while fd 2 (TensorFlow's C++ logs, tqdm) goes to the log.
        self.host_io.redirect(self.session.runs_dir)
        if self.host_io.session_log is not None:
            self.session.engine_log_path = self.host_io.session_log.log_path

    def on_mount(self) -> None:
        self.start_ticking()
        if self.host_io.session_log is not None:
            # Python-level prints and warnings join the session log instead of
            # vanishing into Textual's capture.
            self.begin_capture_print(self)
        self.host_io.install_signal_handlers(self.quit_on_signal)
        self.call_after_refresh(self._after_first_frame)

    def _after_first_frame(self) -> None:
        self.first_frame_at = time.time()
        self.tensorflow_imported_at_first_frame = "tensorflow" in sys.modules
        if os.environ.get(FIRST_FRAME_ENV):
            self.modules_at_first_frame = sorted(sys.modules)
            self.exit(0)
            return
        self.start_after_first_frame()

    def on_print(self, event: events.Print) -> None:
        self.host_io.write_print(event.text)

    def on_unmount(self) -> None:
        # However the app ends (quit, a crash, a test's shutdown), the engine goes with it.
        self.session.close()
        self.host_io.remove_signal_handlers()
        if self.freeze_after_start:
            collector.release()  # what the app froze is the collector's again: an app that ended frees all it held

    def run(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().run(*args, **kwargs)
        finally:
            self.release_session_log()

    def release_session_log(self) -> None:
        """Point fd 2 (and sys.stderr) back where they were when the app started.

        ``run()`` calls this once the app has stopped: the driver restores the
        terminal through the private copy of fd 2 until the very end. A test
        driving ``run_test()`` calls it after the app has stopped, likewise.
        """
        self.host_io.release()

    def show_run_view(self) -> None:
        """Show the Run view next, unless a screen is asked for first (a key typed ahead of a launch wins)."""
        asked = self._screens_asked

        async def show_unless_asked_since() -> None:
            if self._screens_asked == asked:
                await self.action_show("run")

        self.call_later(show_unless_asked_since)

    def ask(self, question: str, *, yes: str, no: str, answered: Callable[[bool], None]) -> None:
        """A modal question with ``yes`` focused (enter, or y); ``answered`` gets the choice (escape: no)."""
        from tpudash.tui.dialogs import ConfirmScreen

        self.push_screen(ConfirmScreen(question, yes=yes, no=no, default_yes=True), lambda yes: answered(bool(yes)))

    # -- actions --------------------------------------------------------------------
    async def action_show(self, mode: str) -> None:
        """Show ``mode``'s own screen: switched to, or, already there, with any run opened over it closed."""
        self._screens_asked += 1
        if mode not in MODE_SCREENS or self.exiting:
            return
        if self.screen.is_modal:
            # A dialog or the palette is open in this mode; switching away would
            # strand it there (and a second palette would clash with it).
            return
        if mode == "devices" and self.first_frame_at is not None:
            self.session.engine_needed()
        if self.current_mode != mode:
            self._previous_mode = self.current_mode
            self.hold_collections_until_switched()
            await self.switch_mode_undelayed(mode, MODE_SCREENS[mode][0])
            return
        # A run opened over this mode's screen (w, enter in History): the mode's key leads back to the screen itself.
        while len(self.screen_stack) > 1 and not self.screen.is_modal:
            await self.pop_screen()

    async def action_back(self) -> None:
        await self.action_show(self._previous_mode if self._previous_mode != self.current_mode else "devices")

    def action_launch_job(self, name: str) -> None:
        self.session.launch_by_name(name)

    async def action_open_form(self, name: str) -> None:
        await self.action_show("jobs")
        # Only the Jobs screen has forms; not while a dialog is open over it.
        open_form = getattr(self.screen, "open_form", None) if self.current_mode == "jobs" else None
        if open_form is not None:
            await open_form(name)

    def action_cancel_job(self) -> None:
        """Cancel the job on the lane; else the last one queued."""
        self.session.cancel_latest()

    def action_watch_live(self) -> None:
        """Open the newest live run: a session run in the Run view, any other in its own live view."""
        live_on_disk = self.session.live_on_disk
        if not live_on_disk:
            self.notify(
                "No run is being written now. Train with TpudashCallback (or tpudash.record) and it "
                "shows up here within a second.",
                title="Nothing live",
                severity="warning",
            )
            return
        newest = live_on_disk[0]
        if newest.run_id in self.session.live_runs:
            self.shown_run_id = newest.run_id
            self.show_run_view()
            return
        self.push_screen(run_detail_screen(newest.run_id))

    def action_reinitialize_runtime(self) -> None:
        """A new engine: TensorFlow and the accelerator set up from scratch."""
        refused = self.session.reinitialize_runtime()
        if refused is not None:
            self.notify(f"{refused[0].upper()}{refused[1:]}.", title="Runtime in use", severity="warning")

    def action_release_engine(self) -> None:
        """Release the accelerator: the engine exits, so a notebook or another process can take the TPU."""
        self.session.release_engine()

    def action_use_framework(self, choice: str) -> None:
        """Run jobs on ``choice`` (auto, tensorflow, jax): the engine starts again on it (the palette's switch)."""
        refused = self.session.use_framework(choice)
        self.settings = self.session.settings  # the screens read the framework from the app's settings too
        if refused is not None:
            self.notify(f"{refused[0].upper()}{refused[1:]}.", title="Framework not switched", severity="warning")


def run_app(settings: Settings, **options: Any) -> int:
    """Build the app and run it in the terminal; returns the exit code."""
    options.setdefault("redirect_stderr", os.environ.get("TPUDASH_NATIVE_STDERR") != "terminal")
    options.setdefault("handle_signals", True)
    options.setdefault("freeze_after_start", True)
    app = TpudashApp(settings, **options)
    app.run()
    if os.environ.get(FIRST_FRAME_ENV) and app.first_frame_at is not None:
        from tpudash.runs.liveness import process_start_time  # psutil: after the frame it times

        started = process_start_time(os.getpid())
        since_start = f"{app.first_frame_at - started:.3f}" if started is not None else "unknown"
        print(
            f"first_frame_unix={app.first_frame_at:.6f} since_process_start={since_start} "
            f"tensorflow_imported={app.tensorflow_imported_at_first_frame} "
            f"modules_at_first_frame={','.join(app.modules_at_first_frame)}"
        )
    return app.return_code or 0
