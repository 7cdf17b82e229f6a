"""What the dashboard does after its first frame, off the UI thread: the host check, the runs scan, screens built ahead.

``AfterFirstFrame`` is an App mixin (``TpudashApp`` places it before
``App``); ``start_after_first_frame()`` starts, in this order:

- the host check (chips, the installed TensorFlow build, the TPU's holder;
  no TensorFlow) on a thread, its verdict handed to the session, which gates
  the engine's start on it (``tpudash.tui.hostgate``);
- the last matmul check on disk, for the Devices screen;
- the scan of the runs directory every ``RUNS_SCAN_SECONDS`` for runs started
  elsewhere (a notebook's fit), one scan at a time, on a thread;
- the telemetry sampler, if the settings ask for one;
- after ``COMPOSE_AHEAD_AFTER_SECONDS``, every mode's screen built ahead in
  idle time, so a key's first press only switches, as a re-visit does; then
  what the process holds is frozen out of the collector's way and full
  collections made rare (``tpudash.tui.collector``) when the app was made
  with ``freeze_after_start``.

A worker that fails says so in a notification.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from textual import work
from textual.worker import Worker, WorkerState

from tpudash.tui import collector
from tpudash.tui.modes import MODE_SCREENS

if TYPE_CHECKING:
    from tpudash.config import Settings
    from tpudash.tui.seams import UndelayedRevisits
    from tpudash.tui.session import DashboardSession
    from tpudash.tui.view import DashboardView

    class _MixedIntoApp(UndelayedRevisits, DashboardView):
        pass
else:
    _MixedIntoApp = object

# How often the runs directory is looked at for runs started elsewhere (a notebook's fit).
RUNS_SCAN_SECONDS = 1.0
# After the first frame, the host check and the engine's start go first; then the other screens are built.
COMPOSE_AHEAD_AFTER_SECONDS = 0.2


class AfterFirstFrame(_MixedIntoApp):
    """The background work that starts once the first frame is on screen, and what it hands the session."""

    session: DashboardSession
    settings: Settings
    exiting: bool
    freeze_after_start: bool

    def __init__(self) -> None:
        super().__init__()
        self._runs_scan_worker: Worker | None = None
        self.settled_in = asyncio.Event()
        """Set once every screen is built ahead and what they hold is out of the collector's way (benchmarks)."""

    def start_after_first_frame(self) -> None:
        """The host check, the last device check, the runs scan, telemetry; the screens built ahead soon after."""
        self.check_host()
        if self.current_mode == "devices":
            self.session.engine_needed()
        self.load_last_device_check()
        self.set_interval(RUNS_SCAN_SECONDS, self._scan_runs_directory, name="tpudash runs scan")
        self._scan_runs_directory()
        if self.settings.telemetry_interval:
            self.session.start_telemetry()
        self.set_timer(COMPOSE_AHEAD_AFTER_SECONDS, self.compose_screens_ahead, name="tpudash compose ahead")

    @work(
        thread=True,
        exit_on_error=False,
        group="host-check",
        description="Scan the host: TPU chips, the TensorFlow build installed, the TPU's holder",
    )
    def check_host(self) -> None:
        try:
            host_check = self.session.inspect_host()
        except Exception:
            self.call_later(self.session.host_checked, None)  # the engine starts as if there were no gate
            raise  # said as the worker's error
        self.call_later(self.session.host_checked, host_check)

    def _scan_runs_directory(self) -> None:
        if self.exiting or (self._runs_scan_worker is not None and self._runs_scan_worker.is_running):
            return
        self._runs_scan_worker = self.scan_runs_directory()

    @work(
        thread=True,
        exit_on_error=False,
        group="runs-scan",
        description="Look in the runs directory for new runs and live runs from other processes",
    )
    def scan_runs_directory(self) -> None:
        self.session.scan_runs_directory()

    @work(thread=True, exit_on_error=False, group="device-check", description="Find the last matmul check on disk")
    def load_last_device_check(self) -> None:
        check = self.session.last_device_check()
        if check is not None:
            self.call_later(self.session.device_check_found, check)

    @work(exclusive=True, group="compose-ahead", exit_on_error=False, description="Build every screen in idle time")
    async def compose_screens_ahead(self) -> None:
        """Each mode's screen built before its key is pressed: a first press only switches, as a re-visit does."""
        for mode, (module_name, *_) in MODE_SCREENS.items():
            if self.exiting:
                return
            await self.compose_mode_ahead(mode, module_name)
        if self.freeze_after_start and not self.exiting:
            # Everything built so far (modules, screens, widgets) lives as long as the app: out of the collector's
            # reach, and full collections made rare (tpudash.tui.collector). No collection first: freezing is a
            # moment's work, a collection of a large heap (a notebook's, with TensorFlow in it) is not, and holds
            # the GIL over the sampler's deadlines. Given back at unmount.
            collector.settle()
        self.settled_in.set()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if event.state == WorkerState.ERROR:
            self.notify(
                f"{type(worker.error).__name__}: {worker.error}",
                title=worker.description or worker.name,
                severity="error",
            )
