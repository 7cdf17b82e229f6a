"""The History screen: every run in the runs directory, opened, overlaid or exported.

Lists job, start, duration, status (``● live`` for a run still being written
on this host, such as the user's own ``fit`` with TpudashCallback;
``interrupted`` for a run whose process died) and final metrics, newest
first, and shows new runs within a second without a key. ``enter`` opens a
run in the run view fed from its events.jsonl, growing as the file grows
while the run is live; ``space`` marks runs and ``o`` overlays
the loss curves of two marked runs; ``e`` exports the highlighted run's
metrics as CSV into its run directory. Runs with unreadable parts still list
and show what could be read, with the problems named.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable, Static
from textual.worker import Worker, WorkerState

from screens.overlay import OverlayScreen
from screens.run_detail import RunDetailScreen
from screens.stored_runs import ExportsRuns
from tpudash.format import brief_metrics, format_seconds, format_timestamp, status_text
from tpudash.runs.store import RunInfo

HISTORY_COLUMNS = ("", "started", "job", "status", "duration", "final metrics", "problems")
MAX_MARKED = 2


def run_status_text(info: RunInfo) -> Text:
    """The status cell: ``● live`` for a run still being written on this host."""
    return status_text("live" if info.live else info.status)


def run_duration_text(info: RunInfo) -> str:
    """How long it took; for a live run, how long it has run so far (as of the last listing)."""
    if info.duration is not None:
        return format_seconds(info.duration)
    if info.live and info.started is not None:
        return f"{format_seconds(max(0.0, time.time() - info.started), precise=False)} so far"
    return ""


class RunsListed(Message):
    """run.json of every run was read (posted from the listing worker)."""

    def __init__(self, infos: list[RunInfo]):
        super().__init__()
        self.infos = infos


class HistoryScreen(ExportsRuns):
    """Past runs, newest first."""

    CSS_PATH = "history.tcss"

    BINDINGS = [
        Binding("space", "toggle_mark", "Mark", id="history.mark"),
        Binding("o", "overlay", "Overlay marked", id="history.overlay"),
        Binding("e", "export", "Export CSV", id="history.export"),
        Binding("f5", "reload", "Reload", id="history.reload"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.runs: dict[str, RunInfo] = {}
        self.marked: list[str] = []

    def compose_body(self) -> ComposeResult:
        yield Static("", id="history-title")
        yield DataTable(id="history-table", zebra_stripes=True, cursor_type="row")

    def on_mount(self) -> None:
        table = self.query_one("#history-table", DataTable)
        for column in HISTORY_COLUMNS:
            table.add_column(column or "✓", key=column or "mark")
        self.watch(self.app, "lane_version", self._lane_changed, init=False)
        # A run started elsewhere (a notebook's fit) appears without a key press.
        self.watch(self.app, "runs_version", self._lane_changed, init=False)

    def on_screen_resume(self, event: events.ScreenResume) -> None:
        # (DashScreen's handler runs too: Textual calls each class's own.)
        self.action_reload()

    def _lane_changed(self, _version: int) -> None:
        if self.is_current:  # (False while the app closes: no screen stack to ask)
            self.action_reload()

    # -- listing --------------------------------------------------------------------
    def action_reload(self) -> None:
        self.list_runs()

    @work(
        thread=True,
        exclusive=True,
        exit_on_error=False,
        group="history-list",
        description="Read run.json of every run in the runs directory",
    )
    def list_runs(self) -> None:
        self.post_message(RunsListed(self.dashboard.session.store.list_runs()))

    def on_runs_listed(self, message: RunsListed) -> None:
        self._show_runs(message.infos)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if event.state == WorkerState.ERROR:
            self.app.notify(
                f"{type(worker.error).__name__}: {worker.error}", title=worker.description, severity="error"
            )

    def _show_runs(self, infos: list[RunInfo]) -> None:
        table = self.query_one("#history-table", DataTable)
        cursor_key = self.highlighted_run_id
        # Newest first by start time: run ids only sort to the second.
        ordered = sorted(infos, key=lambda info: (info.started or 0.0, info.run_id), reverse=True)
        self.runs = {info.run_id: info for info in ordered}
        self.marked = [run_id for run_id in self.marked if run_id in self.runs]
        table.clear()
        for info in self.runs.values():
            started = format_timestamp(info.started, "%m-%d %H:%M:%S")
            problems = Text(f"⚠ {len(info.problems)}", style="yellow") if info.problems else Text("")
            table.add_row(
                "✓" if info.run_id in self.marked else "",
                started,
                info.job,
                run_status_text(info),
                run_duration_text(info),
                brief_metrics(info.final_metrics),
                problems,
                key=info.run_id,
            )
        if cursor_key in self.runs:
            table.move_cursor(row=table.get_row_index(cursor_key))
        where = self.dashboard.session.store.root
        self.query_one("#history-title", Static).update(
            Text.assemble(
                (f"{len(self.runs)} run{'' if len(self.runs) == 1 else 's'}", "bold"),
                f" in {where}   ",
                ("enter open · space mark · o overlay two · e export CSV", "dim"),
            )
        )

    @property
    def highlighted_run_id(self) -> str | None:
        table = self.query_one("#history-table", DataTable)
        if not table.row_count:
            return None
        row_key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
        return row_key.value

    # -- actions ------------------------------------------------------------------------
    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value:
            self.open_run(event.row_key.value)

    def open_run(self, run_id: str) -> None:
        self.app.push_screen(RunDetailScreen(run_id))

    def action_toggle_mark(self) -> None:
        run_id = self.highlighted_run_id
        if run_id is None:
            return
        if run_id in self.marked:
            self.marked.remove(run_id)
        else:
            self.marked.append(run_id)
            del self.marked[:-MAX_MARKED]
        table = self.query_one("#history-table", DataTable)
        for key in self.runs:
            table.update_cell(key, "mark", "✓" if key in self.marked else "")

    def action_overlay(self) -> None:
        if len(self.marked) != 2:
            self.app.notify("Mark two training runs with space first.", title="Overlay", severity="warning")
            return
        self.app.push_screen(OverlayScreen(list(self.marked)))

    def action_export(self) -> None:
        run_id = self.highlighted_run_id
        if run_id is not None:
            self.export_run(run_id)
