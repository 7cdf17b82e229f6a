"""The app's side of the session: the reactives the screens watch and the session writes, and notifications.

``DashboardView`` is the ``tpudash.tui.session.SessionView`` the session shows
through: one reactive per thing a screen draws (the session bar's status
lines, the runtime, the host check, the last device check, the newest
telemetry sample, versions that tell lists of runs to redraw), every
notification kept for the Log screen, and the hooks that redraw the screen on
show or switch to the Run view. ``tpudash.tui.app.TpudashApp`` adds the keys,
the actions and the modes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from textual.app import App
from textual.notifications import SeverityLevel
from textual.reactive import reactive


class DashboardView(App[int]):
    """What the dashboard shows, as reactives; how the screen on show is told to redraw."""

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
    framework_missing: reactive[str | None] = reactive(None, repaint=False)
    """Set when the framework the engine would run on is not installed (``tpudash.tui.hostgate.missing_framework``):
    why, ending with the install line(s) for this host, one a line."""
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

    def __init__(self) -> None:
        super().__init__()
        self.runtime_settled = asyncio.Event()
        """Set when the engine has answered about the runtime (runtime or error)."""
        self.notices: list[tuple[float, str, str]] = []
        """Every notification of this session: (time, severity, message)."""

    def redraw_now(self) -> None:
        """A run was queued, started or ended: the screen on show redraws now rather than at the next tick."""
        raise NotImplementedError

    def show_run_view(self) -> None:
        """Switch to the Run view, which draws ``shown_run_id``."""
        raise NotImplementedError

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information", **kwargs: Any) -> None:
        self.notices.append((time.time(), severity, f"{title}: {message}" if title else message))
        del self.notices[:-500]
        super().notify(message, title=title, severity=severity, **kwargs)
