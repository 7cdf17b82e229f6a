"""The run view's workers: one row per worker of a run written by a training cluster.

``WorkersTable`` draws what ``tpudash.runs.workers.read_workers`` read (worker,
task, host, progress, time per step, heartbeat age, and its state: live,
ended, stale, or straggler in words as well as in style, never colour alone).
``WorkersFeed`` says when the heartbeats are due to be read again (every
``STORE_READ_SECONDS`` in a store, ``LOCAL_READ_SECONDS`` on this disk) and
reads them; the run view calls it on a thread worker, never on the UI thread.
``workers_line`` is the one line the run view shows above its tabs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.text import Text
from textual.widget import Widget
from textual.widgets import DataTable, Static, TabbedContent, TabPane

from tpudash.format import (
    WORKER_STATE_STYLES,
    heartbeat_age,
    worker_progress,
    worker_state,
    worker_step_time,
    worker_task,
    workers_heading,
)
from tpudash.runs.backends import RunFiles
from tpudash.runs.workers import STRAGGLER_MARGIN, WorkerStatus, read_workers

STORE_READ_SECONDS = 5.0
"""A store is asked for a run's heartbeats at most this often: each read is a listing and a request per worker."""
LOCAL_READ_SECONDS = 2.0
COLUMNS = ("worker", "task", "host", "progress", "step time", "heartbeat", "state")
# Widths of the columns but the host's, which takes what is left (never less than MIN_HOST).
FIXED_WIDTHS = (6, 6, None, 13, 9, 9, 9)
MIN_HOST = 8
CELL_PADDING = 2


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def workers_line(statuses: Sequence[WorkerStatus], expected: int | None = None) -> Text | None:
    """The one line above the run view's tabs (``format.workers_heading``); None without workers."""
    return workers_heading(statuses, STRAGGLER_MARGIN, expected) if statuses else None


class WorkersTable(DataTable):
    """One row per worker; ``show`` redraws it from the statuses read last."""

    DEFAULT_CSS = """
    WorkersTable { height: auto; max-height: 1fr; }
    """

    def __init__(
        self, statuses: Sequence[WorkerStatus] = (), *, id: str | None = None, width: int | None = None
    ) -> None:
        """``width``: the columns it will have (a table made in a tab not on show has no size of its own yet)."""
        super().__init__(id=id, zebra_stripes=True, cursor_type="row")
        self.statuses: list[WorkerStatus] = list(statuses)
        self._width = width
        self._shown: tuple | None = None

    def on_mount(self) -> None:
        self.call_after_refresh(lambda: self.show(self.statuses, self._width))

    def show(self, statuses: Sequence[WorkerStatus], width: int | None = None) -> None:
        width = width or self.size.width or 80
        rows = [
            (
                str(status.index),
                worker_task(status),
                status.host,
                worker_progress(status),
                worker_step_time(status.step_seconds),
                heartbeat_age(status.age),
                worker_state(status),
            )
            for status in statuses
        ]
        drawn = (tuple(rows), width)
        if drawn == self._shown:
            return
        self._shown = drawn
        self.statuses = list(statuses)
        fixed = sum(size for size in FIXED_WIDTHS if size is not None)
        host_width = max(MIN_HOST, width - fixed - CELL_PADDING * len(COLUMNS) - 2)
        host_width = min(host_width, max((len(row[2]) for row in rows), default=MIN_HOST))
        widths = [size if size is not None else max(host_width, len("host")) for size in FIXED_WIDTHS]
        self.clear(columns=True)
        for label, size in zip(COLUMNS, widths):
            self.add_column(label, key=label, width=size)
        for row in rows:
            cells: list[Text | str] = [clip(cell, size) for cell, size in zip(row, widths)]
            state = row[-1]
            cells[-1] = Text(state, style=WORKER_STATE_STYLES.get(state, ""))
            if state == "straggler":
                cells[4] = Text(str(cells[4]), style=WORKER_STATE_STYLES["straggler"])
            self.add_row(*cells, key=row[0])


class WorkersFeed:
    """When a run's heartbeats are due to be read, and reading them (call ``read`` off the UI thread)."""

    def __init__(self, files: RunFiles | None, *, local: bool) -> None:
        self.files = files
        self.interval = LOCAL_READ_SECONDS if local else STORE_READ_SECONDS
        self.reading = False
        """A read is under way on a worker thread: another is not started meanwhile."""
        self._next = 0.0
        self.problems: list[str] = []
        """Heartbeats skipped at the last read, each named with why."""

    def due(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.files is not None and not self.reading and now >= self._next

    def begin(self) -> None:
        self.reading = True
        self._next = time.monotonic() + self.interval

    def read(self) -> list[WorkerStatus] | None:
        """The run's workers now; None when the store cannot be asked (tried again at the next interval)."""
        assert self.files is not None
        problems: list[str] = []
        try:
            statuses: list[WorkerStatus] | None = read_workers(self.files, problems=problems)
        except Exception:  # noqa: BLE001 - a store away: the table keeps what it showed
            statuses = None
        finally:
            self.reading = False
        self.problems = problems
        return statuses


class FollowsWorkers(Widget):
    """The run view's part that follows a run's workers: a ``#run-workers`` line and a Workers tab in ``#run-tabs``."""

    _workers_feed: WorkersFeed | None = None
    _workers_tab = False
    _workers_line_shown: Text | None = None
    """What the workers' line shows (None: hidden, as it starts)."""

    def follow_workers(self, files: RunFiles | None, *, local: bool = True) -> None:
        """Read the shown run's worker heartbeats (``files``: the run's; None: no run) on the display beat."""
        shown = self._workers_feed.files if self._workers_feed is not None else None
        if (shown and shown.where) == (files and files.where):
            return
        self._workers_feed = WorkersFeed(files, local=local) if files is not None else None
        self.show_workers([])

    def _read_workers_when_due(self) -> None:
        feed = self._workers_feed
        if feed is None or not feed.due() or getattr(self.app, "exiting", False):
            return  # nothing to read, not yet, or the app is going: no worker is started on its way out
        feed.begin()
        self.run_worker(
            lambda: self._read_workers(feed),
            thread=True,
            exit_on_error=False,
            group="run-view-workers",
            description="read the run's worker heartbeats",
        )

    def _read_workers(self, feed: WorkersFeed) -> None:
        statuses = feed.read()
        if statuses is not None and feed is self._workers_feed:
            try:
                self.app.call_from_thread(self._workers_read, feed, statuses)
            except RuntimeError:
                pass  # the app stopped while this read: there is no view left to show it

    def _workers_read(self, feed: WorkersFeed, statuses: list[WorkerStatus]) -> None:
        if feed is self._workers_feed:  # not another run's, read before the view moved on
            self.show_workers(statuses)

    def show_workers(self, statuses: list[WorkerStatus]) -> None:
        """Draw the workers' line and table (a Workers tab, added with the first worker, hidden without)."""
        if not self.is_mounted:
            return
        line = self.query_one("#run-workers", Static)
        text = workers_line(statuses)
        if text != self._workers_line_shown:  # an update lays the whole screen out again (issue 37)
            self._workers_line_shown = text
            line.update(text or "")
            line.display = text is not None
        tabs = self.query_one("#run-tabs", TabbedContent)
        if not self._workers_tab:
            if statuses:
                self._workers_tab = True
                table = WorkersTable(statuses, id="workers-table", width=max(0, self.size.width - 2) or None)
                tabs.add_pane(TabPane("Workers", table, id="tab-workers"))
            return
        if statuses:
            tabs.show_tab("tab-workers")
        else:
            tabs.hide_tab("tab-workers")
        for table in self.query("#workers-table").results(WorkersTable):
            table.show(statuses, self.size.width - 2)
