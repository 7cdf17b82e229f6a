"""Runs written elsewhere: the runs directory looked at for other writers' runs, live ones noticed, the last device check.

``RunsOnDisk`` scans the runs directory (``tpudash.runs.follow.RunsDirectoryWatch``)
on a worker thread and hands what it found to the UI thread: the live runs
of any writer (``live``, newest first: the telemetry records into them and
w watches the newest), a notice once for each live run another process
started, and a new ``runs_version`` when the list changed, so History
re-lists. An unreadable runs directory is said once, not at every scan. It
also finds the newest matmul check on disk, for the Devices screen before
this session ran one. Textual-free, as the session it serves
(``tpudash.tui.session.DashboardSession``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the store and the follower load after the first frame
    from tpudash.engine.lane import LiveRun
    from tpudash.runs.follow import RunsDirectoryWatch, RunsScan
    from tpudash.runs.store import RunInfo, RunStore
    from tpudash.tui.session_view import SessionView


class WatchingSession(Protocol):
    """What the scans use of ``tpudash.tui.session.DashboardSession`` (named here: the session imports this)."""

    view: SessionView

    @property
    def store(self) -> RunStore: ...

    @property
    def live_runs(self) -> dict[str, LiveRun]: ...


class RunsOnDisk:
    """The runs directory beyond this session's own runs; see the module docstring."""

    def __init__(self, session: WatchingSession, live_changed: Callable[[], None]):
        """``live_changed`` runs on the UI thread after each scan (the session aims its telemetry at ``live``)."""
        self._session = session
        self._live_changed = live_changed
        self._runs_watch: RunsDirectoryWatch | None = None
        self._runs_scan_failed = False
        self.live: list[RunInfo] = []
        """Live runs in the runs directory at the last look (any writer), newest first."""

    def scan(self) -> None:
        """Look for new runs and live runs of other writers (blocking: on a worker thread); the UI hears after."""
        view = self._session.view
        try:
            if self._runs_watch is None:
                from tpudash.runs.follow import RunsDirectoryWatch

                self._runs_watch = RunsDirectoryWatch(self._session.store)
            scan = self._runs_watch.scan()
        except Exception as error:  # an unreadable runs directory: said on the screen, the scans go on
            view.call_later(self.unreadable, error)
            return
        view.call_later(self.scanned, scan)

    def unreadable(self, error: Exception) -> None:
        # Looked at every second: say it once, not every second.
        if not self._runs_scan_failed:
            self._runs_scan_failed = True
            self._session.view.notify(
                f"{type(error).__name__}: {error}", title="Cannot read the runs directory", severity="error"
            )

    def scanned(self, scan: RunsScan) -> None:
        from tpudash.runs.follow import SOURCE_WORDS

        view = self._session.view
        self.live = scan.live
        self._live_changed()
        for info in scan.appeared_live:
            if info.run_id in self._session.live_runs:
                continue  # this session's own run: its Run view is already showing it
            writer = SOURCE_WORDS.get(info.source, info.source)
            view.notify(
                f"{info.job}, from {writer} in pid {info.pid}. Press w to watch it.", title="A run is live", timeout=10
            )
        if scan.changed:
            view.runs_version += 1

    def last_device_check(self) -> dict | None:
        """The newest matmul check on disk with device results (blocking: on a worker thread), or None."""
        from tpudash.runs.follow import RunFollower

        store = self._session.store
        for info in reversed(store.list_runs()):
            if info.job != "matmul" or info.status not in ("done", "failed"):
                continue
            follower = RunFollower(store, info.run_id)
            follower.catch_up()  # in bounded memory, whatever the file holds
            results = follower.model.device_results()
            if results:
                return {
                    "run_id": info.run_id,
                    "job": info.job,
                    "finished": info.finished,
                    "status": info.status,
                    "results": results,
                }
        return None

    def device_check_found(self, check: dict) -> None:
        if self._session.view.device_check is None:  # a check run in this session came first
            self._session.view.device_check = check
