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
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable, Static
from textual.worker import Worker, WorkerState

from screens.base import DashScreen, DisplayTick
from tpudash.format import format_seconds
from tpudash.cli.render import brief_metrics, status_text
from tpudash.runs.follow import SOURCE_WORDS, RunFollower
from tpudash.tui.plots import MetricPlot, PlotLine
from tpudash.runs.store import SOURCE_JOB, RunInfo
from tpudash.runs.model import RunModel
from tpudash.tui.runview import RunView
from tpudash.runs.series import DecimatedSeries

HISTORY_COLUMNS = ("", "started", "job", "status", "duration", "final metrics", "problems")
EXPORT_FILE = "metrics.csv"
MAX_MARKED = 2


def follow_run(store, run_id: str) -> RunFollower:
    """A follower of ``run_id`` that has read everything written so far (call from a worker thread)."""
    follower = RunFollower(store, run_id)
    follower.poll()
    return follower


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


class RunExported(Message):
    """A run's metrics were written as CSV to ``path``."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path


class RunsLoaded(Message):
    """Runs were read from their events.jsonl: a follower each, in the order asked."""

    def __init__(self, followers: list[RunFollower]):
        super().__init__()
        self.followers = followers


class ExportsRuns:
    """A screen mixin: ``export_run(run_id)`` writes the run's metrics as CSV in a worker and says where."""

    @work(thread=True, exit_on_error=False, group="history-export", description="Export a run's metrics as CSV")
    def export_run(self, run_id: str) -> None:
        store = self.app.store
        path = store.find(run_id) / EXPORT_FILE
        path.write_text(store.export(run_id, "csv"), encoding="utf-8")
        self.post_message(RunExported(path))

    def on_run_exported(self, message: RunExported) -> None:
        self.app.notify(f"exported to {message.path}", title="CSV export")


class HistoryScreen(ExportsRuns, DashScreen):
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

    def on_screen_resume(self) -> None:
        self.action_reload()

    def _lane_changed(self, _version: int) -> None:
        if self.is_current:  # (False while the app closes: no screen stack to ask)
            self.action_reload()

    # -- listing --------------------------------------------------------------------
    def action_reload(self) -> None:
        self.list_runs()

    @work(thread=True, exclusive=True, exit_on_error=False, group="history-list",
          description="Read run.json of every run in the runs directory")
    def list_runs(self) -> None:
        self.post_message(RunsListed(self.app.store.list_runs()))

    def on_runs_listed(self, message: RunsListed) -> None:
        self._show_runs(message.infos)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if event.state == WorkerState.ERROR:
            self.app.notify(f"{type(worker.error).__name__}: {worker.error}", title=worker.description,
                            severity="error")

    def _show_runs(self, infos: list[RunInfo]) -> None:
        table = self.query_one("#history-table", DataTable)
        cursor_key = self.highlighted_run_id
        # Newest first by start time: run ids only sort to the second.
        ordered = sorted(infos, key=lambda info: (info.started or 0.0, info.run_id), reverse=True)
        self.runs = {info.run_id: info for info in ordered}
        self.marked = [run_id for run_id in self.marked if run_id in self.runs]
        table.clear()
        for info in self.runs.values():
            started = time.strftime("%m-%d %H:%M:%S", time.localtime(info.started)) if info.started else "?"
            problems = Text(f"⚠ {len(info.problems)}", style="yellow") if info.problems else Text("")
            table.add_row(
                "✓" if info.run_id in self.marked else "", started, info.job, run_status_text(info),
                run_duration_text(info), brief_metrics(info.final_metrics),
                problems, key=info.run_id,
            )
        if cursor_key in self.runs:
            table.move_cursor(row=table.get_row_index(cursor_key))
        where = self.app.store.root
        self.query_one("#history-title", Static).update(Text.assemble(
            (f"{len(self.runs)} run{'' if len(self.runs) == 1 else 's'}", "bold"), f" in {where}   ",
            ("enter open · space mark · o overlay two · e export CSV", "dim")))

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


class RunDetailScreen(ExportsRuns, DashScreen):
    """One run in the run view, read from its events.jsonl; a live run grows as its file does."""

    CSS_PATH = "history.tcss"

    BINDINGS = [
        Binding("escape", "close", "Back", id="history.back"),
        Binding("e", "export", "Export CSV", id="history.detail_export"),
    ]

    def __init__(self, run_id: str):
        super().__init__()
        self.run_id = run_id
        self.follower: RunFollower | None = None
        self.loaded = False

    def compose_body(self) -> ComposeResult:
        yield Static(Text(f"loading {self.run_id}…", style="dim"), id="detail-problems")
        yield Static("", id="detail-source")
        yield RunView(budget=self.app.redraw_budget, id="detail-view")

    def on_mount(self) -> None:
        self.load()

    @work(thread=True, exit_on_error=False, group="history-load", description="Read a run's events.jsonl")
    def load(self) -> None:
        self.post_message(RunsLoaded([follow_run(self.app.store, self.run_id)]))

    def on_runs_loaded(self, message: RunsLoaded) -> None:
        self.follower = message.followers[0]
        self.view.show(self.follower.model)
        self._show_where_from()
        self.loaded = True

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        problems = self.query_one("#detail-problems", Static)
        if event.state == WorkerState.ERROR:
            problems.update(Text(f"cannot open {self.run_id}: {worker.error}", style="bold red"))
            problems.display = True

    def _show_where_from(self) -> None:
        """Who writes the run and whether it still grows; what could not be read."""
        follower = self.follower
        info, model = follower.info, follower.model
        writer = SOURCE_WORDS.get(info.source, info.source)
        pid = f" in pid {info.pid}" if info.pid is not None else ""
        if follower.live:
            text = Text.assemble(status_text("live"), f"  written by {writer}{pid}; this view grows with it")
        elif model.status == "interrupted":
            text = Text.assemble(status_text("interrupted"), f": the process writing it ({writer}{pid}) ended "
                                 "without finishing; everything it wrote is kept")
        elif info.source != SOURCE_JOB:
            text = Text(f"recorded by {writer}{pid}", style="dim")
        else:
            text = Text("")
        source = self.query_one("#detail-source", Static)
        source.update(text)
        source.display = bool(text.plain)
        problems = self.query_one("#detail-problems", Static)
        if model.problems:
            problems.update(Text("⚠ could not read everything: " + "; ".join(model.problems[:5])
                                 + (f" (+{len(model.problems) - 5} more)" if len(model.problems) > 5 else ""),
                                 style="yellow"))
        problems.display = bool(model.problems)

    @property
    def view(self) -> RunView:
        return self.query_one("#detail-view", RunView)

    def on_display_tick(self, tick: DisplayTick) -> None:
        """On the app's timer: read what a live run added, then redraw on the display beat, as the Run view does."""
        force = tick.force
        follower = self.follower
        if follower is None:
            return
        if not follower.ended:
            follower.poll()
            if follower.ended:
                self._show_where_from()
                force = True
        self.view.sync(force)

    def action_close(self) -> None:
        self.dismiss()

    def action_export(self) -> None:
        self.export_run(self.run_id)

    @work(thread=True, exit_on_error=False, group="history-export", description="Export a run's metrics as CSV")
    def export_run(self) -> Path:
        store = self.app.store
        path = store.find(self.run_id) / EXPORT_FILE
        path.write_text(store.export(self.run_id, "csv"), encoding="utf-8")
        return path


def loss_series(model: RunModel) -> list[tuple[str, DecimatedSeries]]:
    """The loss curves of a run worth overlaying: the finest train series, then val."""
    tracks = model.families.get("loss", [])
    lines = []
    for granularity in ("batch", "step", "epoch"):
        train = [track for track in tracks if track.split == "train" and track.granularity == granularity]
        if train:
            track = train[0]
            lines.append(("train", track.smoothed if track.smoothed is not None and len(track.smoothed) else track.series))
            break
    lines += [(track.split, track.series) for track in tracks if track.split != "train"]
    return lines


class OverlayScreen(DashScreen):
    """Two runs' loss curves in one plot."""

    CSS_PATH = "history.tcss"

    BINDINGS = [Binding("escape", "close", "Back", id="history.overlay_back")]

    def __init__(self, run_ids: list[str]):
        super().__init__()
        self.run_ids = run_ids
        self.models: list[RunModel] = []

    def compose_body(self) -> ComposeResult:
        yield Static(Text("loading…", style="dim"), id="overlay-title")
        yield MetricPlot("loss", self.app.redraw_budget, id="overlay-plot")

    def on_mount(self) -> None:
        self.load()

    @work(thread=True, exit_on_error=False, group="history-load", description="Read two runs' events.jsonl")
    def load(self) -> None:
        self.post_message(RunsLoaded([follow_run(self.app.store, run_id) for run_id in self.run_ids]))

    def on_runs_loaded(self, message: RunsLoaded) -> None:
        title = self.query_one("#overlay-title", Static)
        self.models = [follower.model for follower in message.followers]
        colors = (("blue", "cyan"), ("red", "orange"))
        lines: list[PlotLine] = []
        missing = []
        for (train_color, val_color), model in zip(colors, self.models):
            series = loss_series(model)
            if not series:
                missing.append(model.run_id)
            for split, values in series:
                lines.append(PlotLine(f"{model.job} {model.run_id[-6:]} {split}", values,
                                      color=train_color if split == "train" else val_color))
        self.query_one("#overlay-plot", MetricPlot).set_lines(lines)
        text = Text.assemble(("loss: ", "bold"), " vs ".join(model.run_id for model in self.models))
        if missing:
            text.append(f"   no loss metric in {', '.join(missing)}", "yellow")
        title.update(text)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            title = self.query_one("#overlay-title", Static)
            title.update(Text(f"cannot open the runs: {event.worker.error}", style="bold red"))

    @property
    def plot(self) -> MetricPlot:
        return self.query_one("#overlay-plot", MetricPlot)

    def action_close(self) -> None:
        self.dismiss()
