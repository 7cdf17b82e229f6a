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

Where the columns do not fit in one line each (80 columns), the table
narrows instead of cutting: start times lose their seconds, the problems
column its title (``⚠``), a long job name wraps, and the final metrics fill
what is left, whole ``name=value`` items on up to two lines.
"""

from __future__ import annotations

import time

from rich.cells import cell_len
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

HISTORY_COLUMNS = ("", "started", "run", "status", "duration", "final metrics", "problems")
MAX_MARKED = 2
STARTED_PATTERN = "%m-%d %H:%M:%S"
# What the narrow layout gives up first: seconds, the problems column's title, long run names' width.
NARROW_STARTED_PATTERN = "%m-%d %H:%M"
NARROW_PROBLEMS_TITLE = "⚠"
NARROW_NAME_WIDTH = 16
METRIC_LINES = 2
METRICS_MIN_WIDTH = 12
# brief_metrics joins its name=value items with two spaces; a formatted number never holds two.
METRIC_SEPARATOR = "  "
NAME_COLUMN, METRICS_COLUMN, PROBLEMS_COLUMN = (
    HISTORY_COLUMNS.index(name) for name in ("run", "final metrics", "problems")
)


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


def pack_metrics(metrics: str, width: int, max_lines: int = METRIC_LINES) -> Text:
    """``brief_metrics``'s items, whole, in lines of at most ``width`` cells, at most ``max_lines`` lines.

    An item that does not fit on the lines left is dropped rather than cut;
    one wider than a whole line on its own is shortened with an ellipsis.
    """
    lines: list[str] = []
    for item in (piece for piece in metrics.split(METRIC_SEPARATOR) if piece):
        if lines and cell_len(lines[-1]) + len(METRIC_SEPARATOR) + cell_len(item) <= width:
            lines[-1] += METRIC_SEPARATOR + item
        elif len(lines) < max_lines:
            lines.append(item)
    text = Text()
    for index, line in enumerate(lines):
        piece = Text(line)
        piece.truncate(width, overflow="ellipsis")
        text.append_text(piece)
        if index < len(lines) - 1:
            text.append("\n")
    return text


def column_titles(narrow: bool) -> list[str]:
    titles = [column or "✓" for column in HISTORY_COLUMNS]
    if narrow:
        titles[PROBLEMS_COLUMN] = NARROW_PROBLEMS_TITLE
    return titles


def column_widths(titles: list[str], rows: dict[str, list]) -> list[int]:
    """The cells each column takes, padding left out: its widest line, or its title."""

    def width(cell: Text | str) -> int:
        return max((cell_len(line) for line in str(cell).splitlines()), default=0)

    return [
        max([cell_len(title), *(width(cells[index]) for cells in rows.values())]) for index, title in enumerate(titles)
    ]


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
        self._columns: tuple = ()
        """The titles the table's columns have, and the job column's fixed width (None: its content's)."""
        self._shown: dict[str, list] = {}
        """The cells on screen, by run: a listing that changed only some of them updates only those."""
        self._listing: Worker | None = None
        self._list_again = False
        """A reload was asked for while a listing ran: one more follows it."""
        self._title_shown: Text | None = None

    def compose_body(self) -> ComposeResult:
        yield Static("", id="history-title")
        yield DataTable(id="history-table", zebra_stripes=True, cursor_type="row")

    def on_mount(self) -> None:
        self.watch(self.app, "lane_version", self._lane_changed, init=False)
        # A run started elsewhere (a notebook's fit) appears without a key press.
        self.watch(self.app, "runs_version", self._lane_changed, init=False)

    def on_screen_resume(self, event: events.ScreenResume) -> None:
        # (DashScreen's handler runs too: Textual calls each class's own.)
        self.action_reload()

    def on_resize(self, event: events.Resize) -> None:
        # The columns were fitted to the old width: fit them again once the table has its new size.
        self.call_after_refresh(self._refit)

    def _refit(self) -> None:
        self._show_runs(list(self.runs.values()))

    def _lane_changed(self, _version: int) -> None:
        if self.is_current:  # (False while the app closes: no screen stack to ask)
            self.action_reload()

    # -- listing --------------------------------------------------------------------
    def action_reload(self) -> None:
        # One listing at a time, and one more after it when asked meanwhile: a listing that
        # started before a run ended must never land after one that saw it end (on a loaded
        # machine threads finish out of order), and a slow store gets no pile of threads.
        if self._listing is not None and self._listing.state in (WorkerState.PENDING, WorkerState.RUNNING):
            self._list_again = True
            return
        self._list_again = False
        self._listing = self.list_runs()

    @work(
        thread=True,
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
        if worker is self._listing and worker.is_finished and self._list_again:
            self.action_reload()
        if event.state == WorkerState.ERROR:
            self.app.notify(
                f"{type(worker.error).__name__}: {worker.error}", title=worker.description, severity="error"
            )

    def _cells(self, narrow: bool) -> dict[str, list]:
        """Every run's cells, left to right, its final metrics as one line of text."""
        return {
            info.run_id: [
                "✓" if info.run_id in self.marked else "",
                format_timestamp(info.started, NARROW_STARTED_PATTERN if narrow else STARTED_PATTERN),
                info.name or info.job,
                run_status_text(info),
                run_duration_text(info),
                brief_metrics(info.final_metrics),
                Text(f"⚠ {len(info.problems)}", style="yellow") if info.problems else Text(""),
            ]
            for info in self.runs.values()
        }

    def _show_runs(self, infos: list[RunInfo]) -> None:
        table = self.query_one("#history-table", DataTable)
        cursor_key = self.highlighted_run_id
        # Newest first by start time: run ids only sort to the second.
        ordered = sorted(infos, key=lambda info: (info.started or 0.0, info.run_id), reverse=True)
        self.runs = {info.run_id: info for info in ordered}
        self.marked = [run_id for run_id in self.marked if run_id in self.runs]
        # The cells' room, with a vertical scrollbar's kept in reserve: more runs change no width.
        room = (table.size.width or self.app.size.width) - table.styles.scrollbar_size_vertical
        room -= 2 * table.cell_padding * len(HISTORY_COLUMNS)
        rows = self._cells(narrow=False)
        titles = column_titles(narrow=False)
        narrow = sum(column_widths(titles, rows)) > room
        name_width: int | None = None
        if narrow:
            rows, titles = self._cells(narrow=True), column_titles(narrow=True)
            widths = column_widths(titles, rows)
            # A fixed width wraps a long run name rather than taking the metrics' room.
            name_width = widths[NAME_COLUMN] = min(widths[NAME_COLUMN], NARROW_NAME_WIDTH)
            metrics_width = max(METRICS_MIN_WIDTH, room - sum(widths) + widths[METRICS_COLUMN])
        for cells in rows.values():
            metrics = cells[METRICS_COLUMN]
            cells[METRICS_COLUMN] = pack_metrics(metrics, metrics_width) if narrow else Text(metrics)
        if (titles, name_width) != self._columns:
            self._columns = (titles, name_width)
            self._shown = {}
            table.clear(columns=True)
            for key, title in zip(HISTORY_COLUMNS, titles):
                table.add_column(title, key=key or "mark", width=name_width if key == "run" else None)
        if not self._update_changed_cells(table, rows, narrow):
            table.clear()
            for run_id, cells in rows.items():
                # A narrow row is as tall as its wrapped run name and metrics need.
                table.add_row(*cells, key=run_id, height=None if narrow else 1)
            if cursor_key in self.runs:
                table.move_cursor(row=table.get_row_index(cursor_key))
        self._shown = rows
        where = self.dashboard.session.store.where
        heading = Text.assemble(
            (f"{len(self.runs)} run{'' if len(self.runs) == 1 else 's'}", "bold"),
            f" in {where}   ",
            ("enter open · space mark · o overlay two · e export CSV", "dim"),
        )
        if heading != self._title_shown:  # the same words again would lay the screen out at every visit
            self._title_shown = heading
            self.query_one("#history-title", Static).update(heading)

    def _update_changed_cells(self, table: DataTable, rows: dict[str, list], narrow: bool) -> bool:
        """Only the cells that changed, when the same runs are shown in the same order; whether that was enough.

        A bucket of thousands of runs re-listed every visit would otherwise
        refill the whole table on the UI thread (60 ms and more for 2,000
        rows), holding up the next key; usually only the live runs'
        durations and statuses moved.
        """
        if list(rows) != list(self._shown):
            return False
        changed = [
            (run_id, column, cell)
            for run_id, cells in rows.items()
            for column, (cell, before) in enumerate(zip(cells, self._shown[run_id]))
            if cell != before
        ]
        # A narrow row's height follows its wrapped name and metrics: such a change needs the row laid out anew.
        if narrow and any(column in (NAME_COLUMN, METRICS_COLUMN) for _, column, _ in changed):
            return False
        for run_id, column, cell in changed:
            table.update_cell(run_id, HISTORY_COLUMNS[column] or "mark", cell, update_width=True)
        return True

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
        # A row's selection arrives as a message: a key typed after enter (d) may have shown another screen
        # by then, and the run would open over that one instead.
        if self.is_current:
            self.app.push_screen(RunDetailScreen(run_id))

    def action_toggle_mark(self) -> None:
        run_id = self.highlighted_run_id
        if run_id is None:
            return
        before = set(self.marked)
        if run_id in self.marked:
            self.marked.remove(run_id)
        else:
            self.marked.append(run_id)
            del self.marked[:-MAX_MARKED]
        table = self.query_one("#history-table", DataTable)
        for key in before.symmetric_difference(self.marked):  # the rows whose mark changed, not every row
            mark = "✓" if key in self.marked else ""
            table.update_cell(key, "mark", mark)
            if key in self._shown:
                self._shown[key][0] = mark

    def action_overlay(self) -> None:
        if len(self.marked) != 2:
            self.app.notify("Mark two training runs with space first.", title="Overlay", severity="warning")
            return
        self.app.push_screen(OverlayScreen(list(self.marked)))

    def action_export(self) -> None:
        run_id = self.highlighted_run_id
        if run_id is not None:
            self.export_run(run_id)
