"""The run view: one run's status, progress, plots, per-replica values, results and log.

``RunModel`` turns a run's events into what the view draws (bounded metric
histories, the latest per-replica values, result tables, log lines, the
telemetry sampled while the run was live); it knows nothing of Textual, so the
History screen can feed it stored events and a benchmark can feed it a million
points. ``RunView`` draws a model: the Run screen shows this session's runs in
it, History a stored or followed one. A run written by a training cluster
also shows its workers (``follow_workers``): a line above the tabs and a
Workers tab (``tpudash.tui.workers``), read off the UI thread; a run's
profiles are its Profile tab (``tpudash.tui.profiletab``), its advice its
Advice tab, the header's MFU and hint, and the recompile marks on its metric
plots (``tpudash.tui.advicetab``).
"""

from __future__ import annotations

import math

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid, Vertical, VerticalScroll
from textual.widgets import DataTable, Static, TabbedContent, TabPane, Tabs
from textual.widgets.tabbed_content import ContentTab

from tpudash.advice.report import AdviceReport
from tpudash.format import DeviceNames, display_beat, format_value, table_devices
from tpudash.format import status_text as status_text  # the dashboard's status words: tests hold the CLI to them
from tpudash.runs.model import MAX_LOG_LINES, PATH_FAMILIES, TELEMETRY_LINES, MetricTrack, RunModel
from tpudash.tui.advicetab import ADVICE_PANE, AdviceTab, FollowsAdvice
from tpudash.tui.panelog import PaneLog
from tpudash.tui.plots import MetricPlot, PathPlot, PlotLine, ReplicaBarPlot
from tpudash.tui.profiletab import PROFILE_PANE, FollowsProfiles, ProfileTab
from tpudash.tui.progressline import ProgressLine
from tpudash.tui.quiet_widgets import SteadyStatic
from tpudash.tui.replicatable import fill_replica_table, replica_note
from tpudash.tui.runheader import RunHeader, clipped, dashboard_runs_dir, shown_now
from tpudash.tui.seams import being_taken_down
from tpudash.tui.workers import FollowsWorkers, WorkersFeed

# A plot flatter than this shows little but its axes: plots then go side by side, even at
# 80 columns, as long as each stays this wide.
MIN_PLOT_ROWS = 10
MIN_PLOT_COLUMNS = 26
# Below this the run view keeps its rows for the run's own plots; Devices still shows telemetry.
TELEMETRY_MIN_HEIGHT = 30
TELEMETRY_COLORS = {"TPU duty cycle": "green", "HBM used": "magenta", "host CPU": "cyan", "host memory": "gray"}


# -- the view -------------------------------------------------------------------


class RunTabs(TabbedContent):
    """The run view's tabs; they follow the run's content until the user picks one."""

    user_chose = False
    """True once the user clicked or keyed to a tab: the view stops choosing for them."""

    def on_tabs_tab_activated(self, event: Tabs.TabActivated) -> None:
        # Setting ``active`` from code posts no Tabs.TabActivated (TabbedContent
        # holds it back); a click or key does, for a tab not active yet. The
        # one posted at mount comes while no tab is active yet. Tabs of a
        # TabbedContent nested in a pane have that one as parent.
        tab = event.tab
        if (
            event.tabs.parent is self
            and self.active
            and isinstance(tab, ContentTab)
            and self.get_pane(tab).id != self.active
        ):
            self.user_chose = True


class RunView(FollowsWorkers, FollowsProfiles, FollowsAdvice, Vertical):
    """Draws one RunModel: header, error, progress, and tabs of plots, replicas, results, log."""

    # A scoped rule is prefixed with "RunView", so one about the screen's height could never match.
    SCOPED_CSS = False
    DEFAULT_CSS = """
    RunView { height: 1fr; }
    RunView #run-progress { height: auto; padding: 0 1; }
    RunView #run-stage { height: auto; max-height: 2; padding: 0 1; color: $text-muted; display: none; }
    RunView #run-workers { height: auto; max-height: 2; padding: 0 1; display: none; }
    RunView #run-tabs { height: 1fr; }
    RunView TabPane { padding: 0; }
    RunView #plots { height: 1fr; grid-gutter: 0 1; }
    RunView #plots-empty { color: $text-muted; padding: 1; }
    RunView #telemetry-note { height: auto; max-height: 4; padding: 0 1; display: none; }
    RunView #telemetry-plot { height: 10; min-height: 10; display: none; }
    RunView #replica-note { height: auto; padding: 1; color: $text-muted; }
    RunView #replica-plot { height: 1fr; min-height: 8; display: none; }
    RunView #replica-table { height: auto; max-height: 12; }
    RunView #results { height: 1fr; }
    RunView .result-title { margin: 1 0 0 0; }
    RunView #summary-title { margin: 1 0 0 0; }
    RunView .result-table { height: auto; max-height: 24; }
    RunView #run-summary { height: auto; }
    RunView #run-log { height: 1fr; }
    """

    def __init__(self, model: RunModel | None = None, *, id: str | None = None):
        super().__init__(id=id)
        self.model = model
        self._drawn: dict[str, int] = {}
        self._logs_written = 0
        self._tables_drawn: dict[str, int] = {}
        self._device_names = DeviceNames()
        self._result_tables: dict[str, DataTable] = {}
        self._progress_rows: dict[str, ProgressLine] = {}
        self._plots: dict[str, MetricPlot] = {}
        self._path_plot: PathPlot | None = None
        self._plots_shape: tuple[int, int] | None = None
        """The plots' grid as last laid out: (columns, rows)."""
        self._replica_drawn: tuple[int, str, int] | None = None
        self._replica_note_shown: str | None = ""
        """The replica note as last drawn (None: hidden); "" before any."""
        self._beat = 0
        self._ended_shown = False
        self._last_note: Text | None = None
        self._stage_shown: str | None = None
        self._ready = False
        self._plots_note: str | None = ""
        self._workers_feed: WorkersFeed | None = None
        self._workers_tab = False

    def compose(self) -> ComposeResult:
        yield RunHeader(id="run-header")
        yield Vertical(id="run-progress")
        yield SteadyStatic("", id="run-stage", markup=False)  # its clock moves each second
        yield Static("", id="run-workers", markup=False)
        with RunTabs(id="run-tabs"):
            with TabPane("Plots", id="tab-plots"):
                yield Static("", id="plots-empty")
                yield Grid(id="plots")
                yield Static("", id="telemetry-note", markup=False)
                yield MetricPlot(
                    "accelerator and host (%)",
                    xlabel="seconds since the run started",
                    y_range=(0, 100),
                    id="telemetry-plot",
                )
            with TabPane("Replicas", id="tab-replicas"):
                yield Static("", id="replica-note", markup=False)
                yield ReplicaBarPlot(id="replica-plot")
                yield DataTable(id="replica-table", zebra_stripes=True, cursor_type="row")
            with TabPane("Results", id="tab-results"):
                with VerticalScroll(id="results"):
                    yield Static("", id="summary-title")
                    yield Static("", id="run-summary", markup=False)
            with TabPane("Log", id="tab-log"):
                yield PaneLog(id="run-log", max_lines=MAX_LOG_LINES)
            with TabPane("Advice", id=ADVICE_PANE):  # listed once the run has advice (tpudash.tui.advicetab)
                yield AdviceTab(id="advice-tab")
            with TabPane("Profile", id=PROFILE_PANE):  # listed once it has something (tpudash.tui.profiletab)
                yield ProfileTab(id="profile-tab")

    def on_mount(self) -> None:
        if being_taken_down(self):
            return  # a run opened and left at once: its tabs are gone already
        self.hide_profile_tab()
        self.query_one("#run-tabs", RunTabs).hide_tab(ADVICE_PANE)
        self._ready = True
        self.sync(force=True)

    # -- switching what is shown --------------------------------------------------
    def show(self, model: RunModel | None) -> None:
        """Draw another run from scratch."""
        if model is self.model:
            return
        self.model = model
        if not self._ready:
            return  # on_mount draws it
        self._drawn.clear()
        self._logs_written = 0
        self._tables_drawn.clear()
        self._device_names = DeviceNames()
        self._result_tables.clear()
        self._replica_drawn = None
        self._replica_note_shown = ""
        self.query_one("#run-tabs", RunTabs).user_chose = False
        self.query_one(RunHeader).forget()
        self._ended_shown = False
        for row in self._progress_rows.values():
            row.remove()
        self._progress_rows.clear()
        self._stage_shown = None
        self.query_one("#run-stage", Static).display = False
        for plot in list(self._plots.values()) + ([self._path_plot] if self._path_plot else []):
            plot.remove()
        self._plots.clear()
        self._path_plot = None
        self._plots_shape = None
        self._last_note = None
        self._plots_note = ""
        self.query_one("#telemetry-plot", MetricPlot).set_lines([])
        self.query_one("#run-log", PaneLog).clear()
        for table in self.query("#results .result-table, #results .result-title"):
            table.remove()
        self.query_one("#run-summary", Static).update("")
        self.query_one("#summary-title", Static).update("")
        self.query_one("#replica-table", DataTable).clear(columns=True)
        self.query_one("#replica-plot", ReplicaBarPlot).set_values("", [], [])
        self.sync(force=True)

    def _choose_tab(self, pane_id: str) -> None:
        tabs = self.query_one("#run-tabs", RunTabs)
        if tabs.active != pane_id and not tabs.user_chose:
            tabs.active = pane_id

    # -- drawing ----------------------------------------------------------------
    def sync(self, force: bool = False) -> None:
        """Bring every part up to date with the model, plots included, on the display beat."""
        if not self._ready:
            return
        self._read_workers_when_due()
        self._read_advice_when_due()
        model = self.model
        # Every repaint costs the training thread CPU: the clock, the bars,
        # the log, the tables and the plots move together, on the app's
        # display beat; only a change of status shows at once.
        header = self.query_one(RunHeader)
        state_changed = model is not None and header.shown_state != (model.run_id, model.status, model.error)
        beat = display_beat()
        on_beat, self._beat = beat != self._beat, beat
        if not (force or state_changed or on_beat):
            return
        header.sync(model)
        self._sync_plots_note(model)
        if model is None:
            return
        self._sync_progress(model)
        self._sync_stage(model)
        self._sync_log(model)
        self._sync_tables(model)
        self._sync_replicas(model)
        self._sync_telemetry_note(model)
        # The plots are drawn from the same read as the progress, on the same beat: held back
        # by a render budget, they lagged the progress bar by seconds (issue 26, "live means live").
        # What keeps their cost down is redrawing only a plot whose data changed; plotext builds
        # their text in a worker thread (tpudash.tui.plots), which lands a few ms after this beat.
        if (force or on_beat) and self._plots_stale(model):
            self._sync_plots(model)
        self._sync_plots_note(model)  # after the plots: a first plot hides it
        self._choose_tab(self._preferred_tab(model))

    def _plots_stale(self, model: RunModel) -> bool:
        return self._drawn.get("plots") != model.plot_version

    def _preferred_tab(self, model: RunModel) -> str:
        if model.status == "failed" and not model.tracks:
            return "tab-log"
        if model.tracks:
            return "tab-plots"
        if model.latest_numeric_replica or model.replicas:
            return "tab-replicas"
        if model.tables or model.summary:
            return "tab-results"
        return "tab-log" if model.logs_total else "tab-plots"

    def _sync_progress(self, model: RunModel) -> None:
        container = self.query_one("#run-progress", Vertical)
        for unit, state in model.progress.items():
            row = self._progress_rows.get(unit)
            if row is None:
                row = self._progress_rows[unit] = ProgressLine(unit)
                container.mount(row)
            row.show(state, model.finished_state)

    def _sync_stage(self, model: RunModel) -> None:
        text = model.stage_line(shown_now(model, dashboard_runs_dir(self)))  # stands still while the store is away
        if text == self._stage_shown:
            return
        self._stage_shown = text
        line = self.query_one("#run-stage", Static)
        line.update(text or "")
        line.display = text is not None

    def _sync_log(self, model: RunModel) -> None:
        if model.logs_total == self._logs_written and not (model.traceback and not self._ended_shown):
            return
        log = self.query_one("#run-log", PaneLog)
        fresh = min(model.logs_total - self._logs_written, len(model.logs))
        styles = {"warning": "yellow", "error": "bold red", "debug": "dim"}
        for level, text in list(model.logs)[len(model.logs) - fresh :] if fresh > 0 else ():
            prefix = "" if level == "info" else f"{level}: "
            log.write_line(Text(prefix + text, style=styles.get(level, "")))
        self._logs_written = model.logs_total
        if model.finished_state and not self._ended_shown:
            self._ended_shown = True
            if model.traceback:
                log.write_line(Text(model.error or "failed", style="bold red"))
                log.write_line(Text(model.traceback.rstrip(), style="red"))

    def _sync_tables(self, model: RunModel) -> None:
        results = self.query_one("#results", VerticalScroll)
        summary = self.query_one("#run-summary", Static)
        for table_event in model.tables.values():  # the summary names devices as the tables do
            self._device_names.add(table_devices(table_event))
        if (model.summary or model.problems) and self._drawn.get("summary") != model.version:
            names = self._device_names.short
            lines = [f"{key}: {clipped(format_value(value, names), 200)}" for key, value in model.summary.items()]
            lines += [f"problem: {problem}" for problem in model.problems]
            summary.update("\n".join(lines))
            self.query_one("#summary-title", Static).update(Text("Summary", style="bold"))
            self._drawn["summary"] = model.version
        for title, table_event in model.tables.items():
            version = model.table_versions.get(title, 0)
            if self._tables_drawn.get(title) == version:
                continue
            table = self._result_table(results, title)
            table.clear(columns=True)
            table.add_columns(*[str(column) for column in table_event.columns])
            names = self._device_names.add(table_devices(table_event))
            for row in table_event.rows:
                cells = [clipped(format_value(cell, names), 40) for cell in row]
                cells += [""] * (len(table_event.columns) - len(cells))
                table.add_row(*cells[: len(table_event.columns)])
            self._tables_drawn[title] = version

    def _result_table(self, results: VerticalScroll, title: str) -> DataTable:
        table = self._result_tables.get(title)
        if table is None:
            label = Static(Text(title, style="bold"), classes="result-title")
            table = self._result_tables[title] = DataTable(
                classes="result-table", zebra_stripes=True, cursor_type="row"
            )
            results.mount(label, table, before=self.query_one("#summary-title", Static))
        return table

    def _sync_replicas(self, model: RunModel) -> None:
        # The status too: a run that ends without values says so instead of "waiting".
        # The width too: the table's columns are laid out to fit it.
        drawn = (model.replica_version, model.status, self.size.width)
        if self._replica_drawn == drawn:
            return
        self._replica_drawn = drawn
        note = replica_note(model)
        if note != self._replica_note_shown:
            # Only a change: updating the note, even with the same words, lays the whole screen out again
            # and repaints every widget, at each epoch's values while a run trains (issue 37).
            self._replica_note_shown = note
            self.query_one("#replica-note", Static).update(note or "")
            self.query_one("#replica-note", Static).display = note is not None
            self.query_one("#replica-plot", ReplicaBarPlot).display = note is None
        fill_replica_table(self.query_one("#replica-table", DataTable), model, self.size.width - 2)
        if model.latest_numeric_replica:
            event = model.replicas[model.latest_numeric_replica]
            names = self._device_names.add(event.devices or [])
            labels = [
                names.get(str(device)) or str(index)
                for index, device in enumerate(event.devices or [""] * len(event.values))
            ]
            self.query_one("#replica-plot", ReplicaBarPlot).set_values(event.name, labels, event.values)

    def _sync_plots(self, model: RunModel) -> None:
        grid = self.query_one("#plots", Grid)
        for family, tracks in model.families.items():
            if family in PATH_FAMILIES and model.path is not None:
                continue
            version = model.family_versions.get(family, 0)
            plot = self._plots.get(family)
            if plot is None:
                plot = self._plots[family] = MetricPlot(family, classes="metric-plot")
                plot.marks = recompile_steps(self.advice)
                # Loss left of accuracy whichever came first (a job sends loss first, Keras' logs accuracy).
                later = [
                    other
                    for other in grid.children
                    if isinstance(other, MetricPlot) and family_rank(other.title) > family_rank(family)
                ]
                grid.mount(plot, before=later[0] if later else self._path_plot)
            if self._drawn.get(family) != version:
                plot.set_lines(plot_lines(tracks))
                self._drawn[family] = version
        if model.path is not None:
            if self._path_plot is None:
                self._path_plot = PathPlot("path (x0, x1)", classes="metric-plot")
                grid.mount(self._path_plot)
            if self._drawn.get("path") != model.path.seen:
                self._path_plot.set_path(model.path)
                self._drawn["path"] = model.path.seen
        self._sync_telemetry_plot(model)
        self._drawn["plots"] = model.plot_version
        self._layout_plots()

    def _sync_plots_note(self, model: RunModel | None) -> None:
        note = self.query_one("#plots-empty", Static)
        text = None if (self._plots or self._path_plot) else plots_note(model)
        if text != self._plots_note:
            self._plots_note = text
            note.update(text or "")
            note.display = text is not None

    @property
    def telemetry_fits(self) -> bool:
        """Whether the view is tall enough for the telemetry plot as well as the run's own plots."""
        return self.size.height >= TELEMETRY_MIN_HEIGHT

    def _sync_telemetry_plot(self, model: RunModel) -> None:
        """Telemetry on the run's time axis, under the metrics: duty cycle, HBM, host CPU and memory."""
        plot = self.query_one("#telemetry-plot", MetricPlot)
        plot.display = bool(model.telemetry) and self.telemetry_fits
        if model.telemetry and self._drawn.get("telemetry") != model.telemetry_version:
            plot.set_lines(
                [
                    PlotLine(label, model.telemetry[label], color=TELEMETRY_COLORS.get(label))
                    for label, _ in TELEMETRY_LINES
                    if label in model.telemetry
                ]
            )
            self._drawn["telemetry"] = model.telemetry_version

    def _sync_telemetry_note(self, model: RunModel) -> None:
        """Why the TPU gives no telemetry now; else advice when it idled while the run trains."""
        note = self.query_one("#telemetry-note", Static)
        reason = model.telemetry_unavailable.get("tpu") if model.telemetry else None
        hint = None if reason else model.idle_accelerator_hint()
        if not self.telemetry_fits:
            reason = None  # it explains a plot that is not shown
        text = (
            Text(f"TPU telemetry: {reason}", style="dim")
            if reason
            else Text.assemble(("input-bound? ", "bold yellow"), (hint, "yellow"))
            if hint
            else None
        )
        if text is None:
            note.display = False
        elif text != self._last_note:
            note.update(text)
            note.display = True
        self._last_note = text

    def on_resize(self) -> None:
        if not self._ready or being_taken_down(self):
            return  # composed while it was being removed: it has no parts to fit (on_mount drew nothing either)
        if self.model is not None:
            self._sync_replicas(self.model)
            self._sync_telemetry_plot(self.model)
            self._sync_telemetry_note(self.model)
        self._layout_plots()

    def _layout_plots(self) -> None:
        """Every plot whole in the space there is: side by side when wide, or when stacked ones would be too flat."""
        grid = self.query_one("#plots", Grid)
        count = len(self._plots) + (1 if self._path_plot else 0)
        if not count:
            return
        below = 10 if self.query_one("#telemetry-plot", MetricPlot).display else 0
        height = grid.size.height or max(self.size.height - 8 - below, 8)
        most_columns = max(1, min(count, self.size.width // MIN_PLOT_COLUMNS))
        columns = 2 if count > 1 and self.size.width >= 100 else 1
        while columns < most_columns and height // math.ceil(count / columns) < MIN_PLOT_ROWS:
            columns += 1
        shape = (columns, math.ceil(count / columns))
        if shape == self._plots_shape:
            # Setting the grid's styles again, even to the same values, lays the whole screen out
            # anew and repaints every widget: once per display beat while a run trains (issue 37).
            return
        self._plots_shape = shape
        grid.styles.grid_size_columns, grid.styles.grid_size_rows = shape
        grid.styles.grid_rows = "1fr"

    def advice_changed(self, report: AdviceReport | None) -> None:
        """The run's advice, read anew: the header's MFU and hint, the recompiles on the metric plots' step axis."""
        self.advice = report
        self.query_one(RunHeader).show_advice(report, self.model)
        steps = recompile_steps(report)
        for plot in self._plots.values():
            plot.set_marks(steps)

    # -- what tests and the History screen read -----------------------------------
    def plot_for(self, family: str) -> MetricPlot | None:
        return self._plots.get(family)


def plots_note(model: RunModel | None) -> str:
    """What the Plots tab says while it has no plot: "yet" only while the run can still report metrics;
    a run that ended without any says what it has instead (issue 26, 5.21)."""
    if model is None or not model.finished_state:
        return "No metrics yet: the plots appear with the run's first metric."
    has = []
    if model.tables:
        titles = ", ".join(list(model.tables)[:3])
        has.append(f"its {'table' if len(model.tables) == 1 else 'tables'} ({titles}) under Results")
    if model.replicas:
        has.append("values per replica under Replicas")
    if model.summary and not model.tables:
        has.append("its summary under Results")
    if model.logs_total:
        has.append("its log under Log")
    job = model.job or "This run"
    return f"{job} reported no metrics to plot" + (f"; it has {' and '.join(has[:2])}." if has else ".")


def recompile_steps(report: AdviceReport | None) -> tuple[int, ...]:
    """The steps where a step function was traced or compiled again (its first compile is no recompile)."""
    if report is None:
        return ()
    return tuple(sorted({mark.step for mark in report.marks if mark.count > 1}))


def family_rank(family: str) -> int:
    """Where a metric's plot goes among a run's plots: loss first, then accuracy, then the others as they came."""
    if family == "loss" or family.endswith("loss"):
        return 0
    if "acc" in family:
        return 1
    return 2


def plot_lines(tracks: list[MetricTrack]) -> list[PlotLine]:
    """The lines of one metric family: per-step (raw, and smoothed for batches), then epochs."""
    colors = {"train": "blue", "val": "orange", "test": "green"}
    lines: list[PlotLine] = []
    for track in tracks:
        color = colors.get(track.split)
        if track.granularity == "batch":
            lines.append(PlotLine(f"{track.split} (batch)", track.series, color="gray", scatter=True))
            if track.smoothed is not None:
                lines.append(PlotLine(f"{track.split} (smoothed)", track.smoothed, color=color))
        elif track.granularity == "epoch":
            lines.append(PlotLine(f"{track.split} (epoch)", track.series, color=color or "red", markers=True))
        else:
            lines.append(PlotLine(track.split, track.series, color=color))
    return lines
