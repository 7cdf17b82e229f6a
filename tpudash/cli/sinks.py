"""The run sinks of the headless commands: a run's events as a live display (``ConsoleSink``) or JSON lines.

``ConsoleSink`` turns a run's events into a live progress display, log lines,
result tables and a closing summary; ``JsonLinesSink`` prints one JSON event
per line for scripts. Both are runner sinks: they are called on the job
thread, so they only print, never block. ``tpudash watch`` feeds them a
followed run's events the same way, and a cluster's workers as their
heartbeats are read (``show_workers``): a few lines when what they say
changed, on the console only (``--json`` stays the run's events).

When the reader of standard output goes away (``tpudash run … | head``),
a sink stops writing, points file descriptor 1 at /dev/null (so nothing
complains at exit) and calls ``on_output_closed`` once; the CLI cancels the
run then, as a pipe closing would stop any other Unix tool.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table as RichTable
from rich.text import Text

from jobs.events import (
    TRAINING_STAGE,
    Artifact,
    Event,
    Log,
    Metric,
    ReplicaValues,
    RunFinished,
    RunStarted,
    Stage,
    Table,
    dumps,
)
from jobs.events import Progress as ProgressEvent
from tpudash.cli.render import output_console, rich_table, summary_table, worker_cells, workers_lines
from tpudash.format import (
    DeviceNames,
    column_key,
    format_reading,
    format_value,
    runtime_line,
    status_text,
    table_devices,
)
from tpudash.runs.model import StageTimeline

if TYPE_CHECKING:
    from tpudash.runs.workers import WorkerStatus

LEVEL_STYLES = {"debug": "dim", "info": "", "warning": "yellow", "error": "bold red"}
# How often the live display redraws itself (rich's default is 10): each redraw
# renders every bar on rich's own thread, CPU taken from the training beside it
# (issue 37: 1.6 % of a core at 10 Hz, 0.8 % at 4). Four a second still moves
# the bars and clocks smoothly to the eye; a step's count is never more than
# a quarter of a second old.
LIVE_REFRESHES_PER_SECOND = 4


def silence_output(stream: IO[str]) -> None:
    """Send whatever is still buffered for a closed pipe, and all later writes, to /dev/null."""
    try:
        descriptor = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (a test's capture): nothing flushes it at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, descriptor)
    finally:
        os.close(devnull)


class JsonLinesSink:
    """One JSON object per event on ``stream`` (``tpudash run --json``)."""

    def __init__(self, stream: IO[str], on_output_closed: Callable[[], None] | None = None):
        self._stream = stream
        self._lock = threading.Lock()
        self.on_output_closed = on_output_closed
        self.output_closed = False

    def __call__(self, run: object, event: Event, timestamp: float | None = None) -> None:
        """``timestamp``: when the event was written (a followed run's); default now."""
        with self._lock:
            if self.output_closed:
                return
            try:
                self._stream.write(dumps(event, time.time() if timestamp is None else timestamp) + "\n")
                self._stream.flush()
            except BrokenPipeError:
                self.output_closed = True
                silence_output(self._stream)
                if self.on_output_closed is not None:
                    self.on_output_closed()

    def notice(self, text: str) -> None:
        print(f"tpudash: {text}", file=sys.stderr)

    def show_workers(self, statuses: Sequence[WorkerStatus]) -> None:
        """Nothing: the output is the run's events, one JSON object each (the workers are in the run's heartbeats)."""

    def close(self) -> None:
        pass


class CountColumn(MofNCompleteColumn):
    """``3/10``, and nothing for a task that counts nothing (a stage such as building the model)."""

    def render(self, task: Task) -> Text:
        return Text("") if task.total is None else super().render(task)


class ConsoleSink:
    """The human view of one headless run."""

    def __init__(
        self,
        console: Console | None = None,
        on_output_closed: Callable[[], None] | None = None,
        clock: Callable[[], float] | None = None,
    ):
        """``clock``: what the bars' elapsed time and ETA are measured with (default: the console's, monotonic)."""
        # Into a pipe or a file: lines as long as they are (a path whole), no padding (``output_console``).
        self.console = console or output_console(highlight=False)
        self.on_output_closed = on_output_closed
        self.output_closed = False
        # rich's default raises SystemExit, which would unwind the job from
        # inside whatever it was doing; a cancel stops it at its next step.
        self.console.on_broken_pipe = self._output_went_away  # type: ignore[method-assign]  # rich's hook, per console
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            CountColumn(),
            TextColumn("{task.fields[unit]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[metrics]}"),
            console=self.console,
            transient=True,
            get_time=clock,
            refresh_per_second=LIVE_REFRESHES_PER_SECOND,
        )
        self._tasks: dict[str, TaskID] = {}
        self._done: dict[str, int] = {}
        """Each bar's last count, by unit."""
        self._stages = StageTimeline()
        self._replicas_printed: set[str] = set()
        self._replicas_updated: dict[str, ReplicaValues] = {}
        self._stage_task: TaskID | None = None
        self._latest: dict[str, float] = {}
        self._started = False
        self._lock = threading.Lock()
        self._devices = DeviceNames()
        """Every device named in this run's tables, in order: they all get short names together."""
        self._per_device_shown: list[tuple[frozenset[str], frozenset[str]]] = []
        """(devices, column keys) of each per-device table printed, so no value is printed twice."""
        self._workers_shown: tuple | None = None
        """What the workers' lines said when last printed, but their heartbeats' ages (which always change)."""

    def _output_went_away(self) -> None:
        self.console.quiet = True
        if self.output_closed:
            return
        self.output_closed = True
        silence_output(self.console.file)
        if self.on_output_closed is not None:
            self.on_output_closed()

    def notice(self, text: str) -> None:
        if self.output_closed:
            print(f"tpudash: {text}", file=sys.stderr)
        else:
            self.console.print(f"[yellow]{text}[/]")

    def show_workers(self, statuses: Sequence[WorkerStatus]) -> None:
        """A cluster's workers, one line each, when what they say changed since they were last printed.

        The heartbeat's age alone is no change: a quiet cluster prints nothing
        more; a worker's progress, step time or state (straggler, stale, how
        it ended) is.
        """
        if not statuses:
            return
        said = tuple(
            tuple(value for name, value in worker_cells(status).items() if name != "heartbeat") for status in statuses
        )
        with self._lock:
            if said == self._workers_shown or self.output_closed:
                return
            self._workers_shown = said
            for line in workers_lines(statuses):
                # Whole lines, as `tpudash runs` prints into a pipe: `watch | grep straggler` finds the worker.
                self.console.print(line, highlight=False, soft_wrap=True)

    def _metrics_text(self) -> str:
        shown = list(self._latest.items())[-4:]
        return "  ".join(f"{name} {format_reading(value)}" for name, value in shown)

    def __call__(self, run: object, event: Event, timestamp: float | None = None) -> None:
        with self._lock:
            self._render(event, time.time() if timestamp is None else timestamp)

    def _render(self, event: Event, now: float) -> None:
        if isinstance(event, RunStarted):
            self.console.print(
                f"[bold]▶ {event.job}[/]  run [cyan]{event.run_id}[/]  on {escape(runtime_line(event.runtime))}"
            )
            self._progress.start()
            self._started = True
        elif isinstance(event, Log):
            if event.level == "debug":
                return  # detail a result table repeats (matmul's per-device lines); --json and the dashboard keep it
            style = LEVEL_STYLES.get(event.level, "")
            prefix = "" if event.level == "info" else f"{event.level}: "
            self.console.print(f"{prefix}{event.text}", style=style or None, markup=False, highlight=False)
        elif isinstance(event, Stage):
            self._show_stage(event, now)
        elif isinstance(event, ProgressEvent):
            self._show_progress(event)
            if event.unit == "epoch" and self._latest:
                self.console.print(f"epoch {event.done}/{event.total}  {self._epoch_line()}", highlight=False)
        elif isinstance(event, Metric):
            self._latest[event.final_name] = event.value
            if event.split == "test":
                self.console.print(f"test {event.name}: {event.value:.6g}", highlight=False)
        elif isinstance(event, Table):
            self._print_result_table(event)
        elif isinstance(event, ReplicaValues):
            if event.name in self._replicas_printed:
                # Values a run keeps updating (each epoch's validation) print once more, at its end.
                self._replicas_updated[event.name] = event
            else:
                self._replicas_printed.add(event.name)
                self._print_replica_values(event)
        elif isinstance(event, Artifact):
            self.console.print(f"[dim]{event.kind}:[/] {event.path}")
        elif isinstance(event, RunFinished):
            self._stop_progress()
            for update in self._replicas_updated.values():
                self._print_replica_values(update)
            self.console.print(status_text(event.status))
            if event.error:
                self.console.print(f"error: {event.error}", style="red", markup=False)
            self._print_summary(event.summary)

    def _show_progress(self, event: ProgressEvent) -> None:
        """One bar per unit; a count that goes back (the steps of the next epoch) starts its bar and clock over.

        rich stops a task's clock for good once it is complete: without the
        new start, every epoch after the first would show the first one's
        elapsed time and an ETA of 0.
        """
        task = self._tasks.get(event.unit)
        metrics = self._metrics_text()
        if task is None:
            task = self._tasks[event.unit] = self._progress.add_task(
                event.unit + "s", total=event.total, unit="", metrics=metrics
            )
        elif event.done < self._done[event.unit]:
            self._progress.reset(task, total=event.total, unit="", metrics=metrics)
        self._done[event.unit] = event.done
        self._progress.update(task, completed=event.done, total=event.total, metrics=metrics)

    def _shown_per_device(self, name: str, devices: Iterable[object]) -> bool:
        """Whether a printed table already has a ``name`` column for each of ``devices``."""
        wanted = {str(device) for device in devices}
        return bool(wanted) and any(
            column_key(name) in keys and wanted <= shown for shown, keys in self._per_device_shown
        )

    def _print_result_table(self, event: Table) -> None:
        devices = table_devices(event)
        names = None
        if devices:
            names = self._devices.add(devices)
            keys = frozenset(column_key(str(column)) for column in event.columns)
            self._per_device_shown.append((frozenset(devices), keys))
        self.console.print(rich_table(event.title, event.columns, event.rows, names))

    def _print_replica_values(self, event: ReplicaValues) -> None:
        # A job's result table often has the same per-device numbers (matmul's GFLOP/s).
        if self._shown_per_device(event.name, event.devices):
            return
        names = self._devices.add(event.devices)
        table = RichTable(title=event.name, title_justify="left")
        table.add_column("replica", justify="right")
        table.add_column("device", no_wrap=True)
        table.add_column("value", overflow="fold")
        for index, (device, value) in enumerate(zip(event.devices, event.values)):
            table.add_row(str(index), names.get(str(device), str(device)), format_value(value))
        self.console.print(table)

    def _print_summary(self, summary: dict[str, Any]) -> None:
        """The summary without the per-device values a table has shown; device names as in the tables."""
        shown = {
            key for key, value in summary.items() if isinstance(value, dict) and self._shown_per_device(key, value)
        }
        remaining = {key: value for key, value in summary.items() if key not in shown}
        if remaining:
            self.console.print(summary_table(remaining, self._devices.short))

    def _show_stage(self, event: Stage, now: float) -> None:
        """A live line for the stage under way; the preparation's breakdown once the steps begin."""
        was_ready = self._stages.ready
        began = not self._stages.spans or self._stages.spans[-1].name != event.name
        self._stages.apply(event, now)
        if began and self._stage_task is not None:
            # A task of its own per stage: its clock starts with the stage.
            self._progress.remove_task(self._stage_task)
            self._stage_task = None
        if event.name == TRAINING_STAGE:
            if not was_ready:
                self.console.print(self._stages.line(now, finished=False), style="dim", highlight=False)
            return
        if self._stage_task is None:
            self._stage_task = self._progress.add_task(event.name, total=event.total, unit="", metrics="")
        self._progress.update(self._stage_task, completed=event.done or 0, total=event.total)

    def _epoch_line(self) -> str:
        return "  ".join(f"{name} {format_reading(value)}" for name, value in self._latest.items())

    def _stop_progress(self) -> None:
        if self._started:
            self._progress.stop()
            self._started = False

    def close(self) -> None:
        with self._lock:
            self._stop_progress()
