"""The dashboard's session, without Textual: the runs it launches, the engine that runs them, how it quits.

``DashboardSession`` wires the runs directory (``RunStore``), the lane
(``tpudash.engine.lane.Lane``) and the engine that executes its runs; it
starts and releases the engine (once the host check allows it:
``HostGate``), validates launches and cancels, decides the quit flow (what to
ask, when the engine is released) and aims the telemetry sampling thread
(``TelemetryFeed``) at the runs live now. What the lane says is shown by
``LaneNews`` (``tpudash.tui.lane_news``: the runtime, a run's end, the
session bar's status text); runs written elsewhere are followed by
``RunsOnDisk`` (``tpudash.tui.runs_on_disk``). Everything is shown through a
``SessionView`` (``tpudash.tui.session_view``: the Textual app's reactives and
notifications), so the session is tested with a plain object for a view,
scripted engines and an injected clock, as ``Lane`` is. Whatever reaches it
from another thread (an engine reply, a scan of the runs directory, a
telemetry sample) is handed to the UI thread with the view's ``call_later``,
so its state changes only there.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpudash.config import Settings
from tpudash.format import display_beat
from tpudash.tui.hostgate import HostGate
from tpudash.tui.lane_news import LaneNews
from tpudash.tui.runs_on_disk import RunsOnDisk
from tpudash.tui.session_view import SessionView, Severity
from tpudash.tui.telemetry_feed import TelemetryFeed

if TYPE_CHECKING:  # the lane, the store, the engine's handle and telemetry load on first use, after the first frame
    from jobs.base import JobSpec
    from tpudash.accel.hostcheck import HostCheck
    from tpudash.engine.handle import EngineHandle, Listener
    from tpudash.engine.lane import Lane, LiveRun
    from tpudash.runs.store import RunInfo, RunStore
    from tpudash.telemetry.sampling import TelemetrySampler

# The view's protocol and its severities, importable from here as they were before they had a module of their own.
__all__ = ["MAX_SESSION_RUNS", "MAX_WAITING_RUNS", "DashboardSession", "EngineFactory", "SessionView", "Severity"]

# How many runs may wait for the lane: a longer queue is more likely a key
# held down than a plan, and each waiting run is one more to cancel on quit.
MAX_WAITING_RUNS = 4
# Runs of this session kept in memory for the run view (their models are bounded).
MAX_SESSION_RUNS = 50

EngineFactory = Callable[["Listener"], "EngineHandle"]


class DashboardSession:
    """The session's runs, engine, runs directory and telemetry, shown through a ``SessionView``."""

    def __init__(
        self,
        settings: Settings,
        view: SessionView,
        *,
        engine_factory: EngineFactory | None = None,
        job_specs: Mapping[str, JobSpec] | None = None,
        host_check_provider: Callable[[], HostCheck] | None = None,
        telemetry_sampler: Callable[[Settings], TelemetrySampler] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``engine_factory`` replaces how an engine is started (tests run it on a thread), ``job_specs``
        the job registry, ``host_check_provider`` ``tpudash.accel.hostcheck.inspect`` and
        ``telemetry_sampler`` ``tpudash.telemetry.sampling.telemetry_sampler``; ``clock`` is the lane's."""
        self.settings = settings
        self.view = view
        self._engine_factory = engine_factory
        self._job_specs = dict(job_specs) if job_specs is not None else None
        self._host_check_provider = host_check_provider
        self._telemetry_sampler = telemetry_sampler
        self._clock = clock
        self.engine_log_path: Path | None = None
        """Where the engine's stderr goes: the session log holding fd 2, when the app redirected it."""
        self._store: RunStore | None = None
        self._lane: Lane | None = None
        self.quitting = False
        """True once quit was confirmed (or a signal came): no new run starts."""
        self._beat = 0
        self._poll_posted = False
        self.news = LaneNews(self)
        """The lane's observer: what it says (the runtime, a run's end), shown; the session bar's status text."""
        self.on_disk = RunsOnDisk(self, self._aim_telemetry)
        """Runs written elsewhere: other writers' live runs, History's list, the last device check on disk."""
        self.telemetry = TelemetryFeed(settings, self._deliver_telemetry, telemetry_sampler)
        """The sampling thread behind the view's ``telemetry`` (started after the first frame, unless off)."""
        self.gate = HostGate(self)
        """The host check, and whether it lets the engine start (no TensorFlow, the TPU held elsewhere)."""

    # -- wiring ---------------------------------------------------------------------------------
    @property
    def runs_dir(self) -> Path | str:
        """The runs directory: a local Path, or a store's URL."""
        from tpudash.config import default_runs_dir

        return self.settings.runs_dir or default_runs_dir(os.environ)

    @property
    def store(self) -> RunStore:
        """The runs directory (created on first use, after the first frame)."""
        if self._store is None:
            from tpudash.runs.store import RunStore

            self._store = RunStore(self.runs_dir)
        return self._store

    @property
    def lane(self) -> Lane:
        """The session's runs and the engine that executes them (made on first use)."""
        if self._lane is None:
            from tpudash.engine.lane import Lane

            self._lane = Lane(
                self.store,
                self._start_engine,
                self.news,
                self._wake_for_lane,
                cancel_grace=self.settings.cancel_grace,
                release_after=self.settings.release_after,
                keep_runs=MAX_SESSION_RUNS,
                clock=self._clock,
            )
        return self._lane

    @property
    def job_specs(self) -> dict[str, JobSpec]:
        """Every job the session offers, by name (the registry unless injected)."""
        if self._job_specs is None:
            from jobs import registry

            self._job_specs = dict(registry())
        return self._job_specs

    @property
    def live_runs(self) -> dict[str, LiveRun]:
        """This session's runs by id, in launch order (the lane keeps the last ``MAX_SESSION_RUNS``)."""
        return {live.run_id: live for live in self._lane.runs} if self._lane is not None else {}

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

    def inspect_host(self) -> dict:
        """What the host scan finds before TensorFlow (chips, builds, holders); blocking, off the UI thread."""
        if self._host_check_provider is not None:
            return self._host_check_provider().to_dict()
        from tpudash.accel.hostcheck import inspect

        return inspect().to_dict()

    # -- the engine -------------------------------------------------------------------------------
    def _start_engine(self, listener: Listener) -> EngineHandle:
        if self._engine_factory is not None:
            return self._engine_factory(listener)
        from tpudash.accel.nativelog import session_log_path
        from tpudash.engine.handle import EngineProcess

        self.store.prepare()
        return EngineProcess(listener, self.engine_settings, self.engine_log_path or session_log_path(self.runs_dir))

    @property
    def engine_settings(self) -> Settings:
        """What an engine starts with now: the TPU left alone (tpu "none") once the user chose the CPU beside its holder."""
        return self.gate.engine_settings()

    def _wake_for_lane(self) -> None:
        """An engine message arrived (on a reader thread): poll the lane now rather than at the next tick."""
        if not self._poll_posted:
            self._poll_posted = True
            self.view.call_later(self._poll_woken)

    def _poll_woken(self) -> None:
        self._poll_posted = False
        if self._lane is not None and self._lane.poll():
            self.lane_changed()

    def engine_needed(self) -> None:
        """The Devices screen needs the runtime: start the engine unless it was ever started, once the host check
        allows it (``HostGate``: no engine without TensorFlow, nor beside another process that holds the TPU)."""
        if not self.quitting and self.gate.engine_may_start():
            self.lane.ensure_engine()
            self._update_engine_status()

    def host_checked(self, host_check: dict | None) -> None:
        """The host scan answered (None: it failed): what it means for the engine; start it if it was wanted."""
        if self.gate.checked(host_check):
            self.engine_needed()

    def reinitialize_runtime(self) -> str | None:
        """A new engine, TensorFlow set up from scratch (even where the host check withheld it); why not, when a
        run holds the engine."""
        beside = self.gate.before_restart() if not self.lane.busy else None
        refused = self.lane.restart_engine()
        if refused is not None:
            return refused
        self.gate.show_connecting(beside)
        self._update_engine_status()
        return None

    def use_framework(self, choice: str) -> str | None:
        """Run jobs on ``choice`` (auto, tensorflow, jax) from now on: a new engine on it; why not, when a run holds
        the engine."""
        if self._lane is not None and self._lane.busy:
            return "a run holds the engine: cancel it or wait, then switch"
        self.settings = dataclasses.replace(self.settings, framework=choice)
        withheld = self.gate.withheld() if self.gate.host_check is not None else None
        if withheld is not None and withheld.reason == "no-framework":
            if self._lane is not None and self._lane.engine is not None:
                self._lane.release()
            self.gate.show_missing_framework(withheld.message, withheld.status)
            self._update_engine_status()
            return None
        return self.reinitialize_runtime()

    def release_engine(self) -> None:
        """Release the accelerator: the engine exits, so a notebook or another process can take the TPU."""
        refused = self.lane.release()
        if refused is not None:
            self.view.notify(f"Not released: {refused}.", title="Release the accelerator", severity="warning")
            return
        self.view.notify(
            "The engine exited; the accelerator is free. The next launch starts a new engine.",
            title="Accelerator released",
        )
        self._update_engine_status()

    # -- the lane ---------------------------------------------------------------------------------
    def lane_changed(self) -> None:
        """Something changed on the lane (a launch, a cancel, a run's start or end): status, lists, the screen."""
        self._aim_telemetry()
        self.view.lane_version += 1
        self._update_engine_status()
        self._update_lane_status()
        self.view.redraw_now()

    def tick(self) -> None:
        """The UI's timer: read the engine's news and the running run's events; the clock shown once a second."""
        if self._lane is not None and self._lane.poll():
            self.lane_changed()
        beat = display_beat()
        if beat != self._beat:
            self._beat = beat
            self._update_lane_status()

    def _update_engine_status(self) -> None:
        self.news.show_engine_status(self._lane)

    def _update_lane_status(self) -> None:
        self.news.show_lane_status(self._lane)

    def lane_status_text(self, lane: Lane) -> str:
        """The session bar's words for the lane: the running job, its status and clock, the queue, the last end."""
        return self.news.lane_status_text(lane)

    # -- launching ----------------------------------------------------------------------------------
    def launch(self, spec: JobSpec, params: dict) -> LiveRun | None:
        """Queue ``spec`` with validated ``params``; the engine runs it when the lane is free (None: refused)."""
        if self.quitting:
            return None
        view = self.view
        if view.framework_missing is not None:
            # Refused here, nothing reaches the engine, so no run directory or
            # failed record is made for a job that could never start.
            missing = view.runtime_status if view.runtime_status.startswith("no ") else "no TensorFlow"
            view.notify(
                view.framework_missing, title=f"{spec.name} not launched: {missing}", severity="error", timeout=15
            )
            return None
        not_here = self.not_on_framework(spec)
        if not_here is not None:
            view.notify(not_here, title=f"{spec.name} not launched", severity="error", timeout=15)
            return None
        if len(self.lane.waiting) >= MAX_WAITING_RUNS:
            view.notify(
                f"{MAX_WAITING_RUNS} runs are already waiting; cancel one or wait.",
                title="Queue full",
                severity="warning",
            )
            return None
        if self.gate.asked_to_run_on_cpu(spec, params):
            return None  # the answer launches it, or not
        busy = self.lane.current
        live = self.lane.launch(spec, params)
        view.shown_run_id = live.run_id
        self.lane_changed()
        if busy is not None:
            view.notify(f"{spec.name} queued behind {busy.job}", title="Queued")
        view.show_run_view()
        return live

    @property
    def framework(self) -> str:
        """``tensorflow`` or ``jax``: what this session's jobs run on (the engine's runtime says, once it has)."""
        runtime = self.view.runtime
        return str(runtime.framework) if runtime is not None else self.gate.framework

    def not_on_framework(self, spec: JobSpec) -> str | None:
        """Why ``spec`` cannot run on this session's framework (``not on JAX: …``); None when it can.

        Asked of ``frameworks()``, never ``runner_for``: that would import the runner here, in the dashboard.
        """
        framework = self.framework
        if framework in spec.frameworks():
            return None
        from tpudash.config import FRAMEWORK_NAMES

        why = spec.not_on_jax if framework == "jax" else ""
        return f"not on {FRAMEWORK_NAMES.get(framework, framework)}: {why or 'it has no runner there'}"

    def launch_by_name(self, name: str, overrides: Mapping[str, Any] | None = None) -> LiveRun | None:
        """Resolve a job's params from ``overrides`` (checked against the runtime too), then ``launch``."""
        from jobs.base import ParamError

        spec = self.job_specs.get(name)
        if spec is None:
            self.view.notify(
                f"job {name!r} is not installed; available: {', '.join(self.job_specs)}",
                title="Unknown job",
                severity="error",
            )
            return None
        try:
            params = spec.resolve(overrides or {})
            if self.view.runtime is not None and spec.check_runtime is not None:
                spec.check_runtime(params, self.view.runtime)
        except ParamError as error:
            self.view.notify(str(error), title=f"{name}: bad params", severity="error")
            return None
        return self.launch(spec, params)

    def cancel_run(self, live: LiveRun) -> None:
        """Cancel one session run: a queued one leaves the queue; a running one stops within the grace period."""
        self.lane.cancel(live)
        self.view.notify(f"Cancelling {live.job}…", title="Cancel")
        self.lane_changed()

    def cancel_latest(self) -> None:
        """Cancel the job on the lane; else the last one queued."""
        lane = self._lane
        live = lane.current if lane is not None else None
        if live is None:
            waiting = lane.waiting if lane is not None else []
            if not waiting:
                self.view.notify("No job is running.", severity="warning")
                return
            live = waiting[-1]
        self.cancel_run(live)

    # -- quitting -----------------------------------------------------------------------------------
    def quit_question(self) -> str | None:
        """What to ask before quitting (a run is running or waiting), or None: quit at once."""
        if not self.busy:
            return None
        current = self.lane.current
        what = f"{current.job} is running" if current is not None else "runs are waiting"
        waiting = len(self.lane.waiting)
        more = f" and {waiting} more wait" if current is not None and waiting else ""
        return f"{what}{more}. Quitting cancels it and records it as cancelled."

    def begin_quit(self) -> None:
        """Quit was confirmed: cancel every run; ``stopped`` tells when the cancels are recorded."""
        self.quitting = True
        if self._lane is not None:
            self._lane.stop()
            self.lane_changed()
            if not self._lane.stopped:
                self.view.notify(
                    "Cancelling the running job, then quitting… (q again: quit without waiting)", title="Quit"
                )

    @property
    def stopped(self) -> bool:
        """After ``begin_quit``: nothing runs any more (the lane ends the engine after the grace period)."""
        return self._lane is None or self._lane.stopped

    def close(self) -> None:
        """The app is leaving, however it ends: the engine goes too (it cancels and records its job), and sampling."""
        # The engine cancels its job, records it, and exits, releasing the accelerator for the next process.
        if self._lane is not None:
            self._lane.close()
        self.telemetry.stop()

    # -- runs written elsewhere (``RunsOnDisk``) ------------------------------------------------------
    @property
    def live_on_disk(self) -> list[RunInfo]:
        """Live runs in the runs directory at the last look (any writer), newest first."""
        return self.on_disk.live

    def scan_runs_directory(self) -> None:
        """Look for new runs and live runs of other writers (blocking: on a worker thread); the UI hears after."""
        self.on_disk.scan()

    def last_device_check(self) -> dict | None:
        """The newest matmul check on disk with device results (blocking: on a worker thread), or None."""
        return self.on_disk.last_device_check()

    def device_check_found(self, check: dict) -> None:
        self.on_disk.device_check_found(check)

    # -- telemetry ----------------------------------------------------------------------------------
    def start_telemetry(self) -> threading.Thread:
        """Sample until ``close``; every live run gets the samples taken while it is live."""
        return self.telemetry.start()

    def _deliver_telemetry(self, stamp: float, sample: Any) -> None:
        self.view.call_later(self._telemetry_sampled, stamp, sample)  # from the sampling thread

    def _telemetry_sampled(self, stamp: float, sample: Any) -> None:
        self.view.telemetry = (stamp, sample)

    def _aim_telemetry(self) -> None:
        """Which runs are live now (this session's and any other process's on this host), and whose memory to show.

        In a store only this session's own run gets samples: other writers' may be on other hosts.
        """
        from tpudash.telemetry.recorder import target_of

        store, current = self.store, self.current_live_run
        others = [info.run_id for info in self.live_on_disk] if store.local else []
        run_dirs = [target_of(store, run_id) for run_id in others + ([current.run_id] if current is not None else [])]
        processes: dict[str, int] = {}
        if self.engine_pid is not None:
            processes["engine"] = self.engine_pid
        writers = [info.pid for info in self.live_on_disk if info.pid is not None and info.pid != self.engine_pid]
        if writers:
            processes["writer"] = writers[0]
        self.telemetry.aim(run_dirs, processes)
