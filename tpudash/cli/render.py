"""Headless rendering for ``tpudash run`` and the listing commands (rich).

``ConsoleSink`` turns a run's events into a live progress display, log lines,
result tables and a closing summary; ``JsonLinesSink`` prints one JSON event
per line for scripts. Both are runner sinks: they are called on the job
thread, so they only print, never block.

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
from datetime import datetime
from typing import IO, Callable, Iterable, Mapping

from rich import box
from rich.console import Console, Group
from rich.measure import Measurement
from rich.padding import Padding
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table as RichTable
from rich.text import Text

from jobs.events import (
    Artifact,
    Event,
    Log,
    Metric,
    Progress as ProgressEvent,
    ReplicaValues,
    RunFinished,
    RunStarted,
    TRAINING_STAGE,
    Stage,
    Table,
    Telemetry,
    dumps,
    split_final_name,
)
from tpudash.format import format_seconds
from tpudash.runs.model import StageTimeline

LEVEL_STYLES = {"debug": "dim", "info": "", "warning": "yellow", "error": "bold red"}
# Each status's glyph and colour, the one table for the CLI and the dashboard
# (the run view, History). "live": still being written by a process on this host.
STATUS_GLYPHS = {
    "queued": ("◌", "dim"),
    "running": ("▶", "bold cyan"),
    "live": ("●", "bold yellow"),
    "done": ("✓", "bold green"),
    "failed": ("✗", "bold red"),
    "cancelled": ("■", "bold magenta"),
    "interrupted": ("!", "bold bright_blue"),
}
UNKNOWN_STATUS_GLYPH = ("?", "")


def status_text(status: str) -> Text:
    """``✓ done`` in the status's colour, as every front end shows a run's status."""
    glyph, style = STATUS_GLYPHS.get(status, UNKNOWN_STATUS_GLYPH)
    return Text(f"{glyph} {status}", style=style)


def short_device_names(names: Iterable[str]) -> dict[str, str]:
    """Each device name shortened to what tells it apart from the others.

    ``/job:localhost/replica:0/task:0/device:CPU:3`` → ``CPU:3``; devices of
    several tasks keep the task (``task:1/TPU:0``). Other text is kept as it is.
    """
    segments = {name: [part.removeprefix("device:") for part in name.strip("/").split("/")] for name in names}
    for kept in range(1, max(map(len, segments.values()), default=0) + 1):
        short = {name: "/".join(parts[-kept:]) for name, parts in segments.items()}
        if len(set(short.values())) == len(short):
            return short
    return {name: name for name in segments}


class DeviceNames:
    """The devices a run has named so far, each shortened as ``short_device_names`` does.

    A run names its devices bit by bit (a table, then per-replica values);
    the short names are worked out over all of them, so ``CPU:3`` means the
    same device in every table of a run, in the CLI and in the dashboard.
    """

    def __init__(self) -> None:
        self._seen: dict[str, None] = {}

    def add(self, devices: Iterable) -> dict[str, str]:
        """Remember ``devices``; the short name of every device seen so far."""
        self._seen.update(dict.fromkeys(str(device) for device in devices))
        return self.short

    @property
    def short(self) -> dict[str, str]:
        return short_device_names(self._seen)


def table_devices(event: Table) -> list[str]:
    """The device column of a result table, if it has one (matmul's per-device check)."""
    keys = [column_key(str(column)) for column in event.columns]
    if "device" not in keys:
        return []
    column = keys.index("device")
    return [str(row[column]) for row in event.rows if len(row) > column]


def format_value(value, device_names: Mapping[str, str] | None = None) -> str:
    """Numbers compact, matrices and lists as nested brackets, mappings as ``key=value, …``.

    ``device_names`` (from ``short_device_names``) shortens device names
    wherever they appear as text or as keys.
    """
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(item, device_names) for item in value) + "]"
    if isinstance(value, dict):
        return ", ".join(f"{format_value(key, device_names)}={format_value(item, device_names)}"
                         for key, item in value.items())
    if isinstance(value, str) and device_names:
        return device_names.get(value, value)
    return str(value)


def brief_metrics(metrics: Mapping, limit: int = 4) -> str:
    """A run's final metrics in a runs list, ``name=value``, at most ``limit``.

    Losses and accuracies first, held-out splits before training (test, then
    val), and per-batch values only when a run has nothing else.
    """
    items = [(name, value) for name, value in metrics.items() if isinstance(value, (int, float))]
    items = [item for item in items if not item[0].startswith("batch_")] or items
    split_rank = {"test": 0, "val": 1}

    def rank(item) -> tuple:
        split, name = split_final_name(item[0])
        return ("loss" not in name and "acc" not in name, split_rank.get(split, 2))

    return "  ".join(f"{name}={format_value(float(value))}" for name, value in sorted(items, key=rank)[:limit])


def column_key(name: str) -> str:
    """A name as it compares with a column title: ``gflops`` is ``GFLOP/s``, ``median_ms`` is ``median ms``."""
    return "".join(character for character in name.casefold() if character.isalnum())


def format_bytes(count: int | float | None) -> str:
    if count is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return str(count)


def format_used_of(used: float | None, total: float | None) -> str:
    """``4.0/16.0 GiB``: both in the total's unit."""
    if used is None or not total:
        return format_bytes(used if used is not None else total)
    unit_total = format_bytes(total)
    number, unit = unit_total.split(" ", 1)
    scale = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3, "TiB": 1024 ** 4}[unit]
    return f"{used / scale:.1f}/{number} {unit}"


SPARK_LEVELS = "▁▂▃▄▅▆▇█"
# Sized so a telemetry table fits an 80-column terminal.
METER_WIDTH = 10
SPARK_WIDTH = 16
# Wide enough that rich measures a table without squeezing it.
UNLIMITED_WIDTH = 10_000
# The narrowest a column whose words are broken may get.
MIN_FOLDED_WIDTH = 4


def percent_style(percent: float) -> str:
    return "red" if percent >= 90 else "yellow" if percent >= 70 else "green"


def meter(percent: float | None, width: int = METER_WIDTH, label: str | None = None) -> Text:
    """``█████░░░░░ 47%``: a bar for a percentage, as nvitop draws one; ``n/a`` when not measured."""
    if percent is None:
        return Text("n/a".ljust(width + 5), style="dim")
    clamped = min(100.0, max(0.0, percent))
    filled = round(width * clamped / 100)
    text = Text("█" * filled, style=percent_style(clamped))
    text.append("░" * (width - filled), style="dim")
    text.append(f" {percent:3.0f}%" if label is None else f" {label}")
    return text


def sparkline(values: Iterable[float | None], width: int = SPARK_WIDTH, top: float = 100.0) -> Text:
    """The last ``width`` values (0 to ``top``) as ``▁▃▅█``; a gap where a value was not measured."""
    cells = list(values)[-width:]
    text = Text()
    for value in cells:
        if value is None:
            text.append(" ")
        else:
            level = min(len(SPARK_LEVELS) - 1, max(0, int(value / top * len(SPARK_LEVELS))))
            text.append(SPARK_LEVELS[level], style=percent_style(100 * value / top))
    return text


def telemetry_view(sample: Telemetry, history: Iterable[Telemetry] = (), tpu_address: str | None = None) -> Group:
    """One telemetry sample as tables: TPU chips (duty cycle, HBM, bandwidth), host CPU and memory.

    ``history``: the samples before it, oldest first, drawn as sparklines
    (no sparkline column without them). A source that gave nothing is a line
    saying why. The Devices screen and ``tpudash telemetry`` show the same.
    """
    from tpudash.telemetry.sampling import summarize

    past = list(history)[-(SPARK_WIDTH - 1):]
    trend_of = (lambda values: sparkline(values)) if past else None
    past.append(sample)

    def table(title: str, columns: tuple[str, ...]) -> RichTable:
        grid = RichTable(title=title, title_justify="left", title_style="bold", box=None, padding=(0, 1))
        for column in columns + (("last samples",) if trend_of else ()):
            grid.add_column(column, no_wrap=True)
        return grid

    def row(grid: RichTable, *cells, trend=None) -> None:
        grid.add_row(*cells, *((trend_of(trend or ()),) if trend_of else ()))

    parts: list = []
    if sample.chips:
        source = f" — libtpu's metrics service at {tpu_address}" if tpu_address else ""
        tensorcore = any(chip.get("tensorcore_util_pct") is not None for chip in sample.chips)
        chips = table(f"TPU{source}", ("chip", "duty cycle", "HBM used", "HBM BW") + (("TensorCore",) if tensorcore else ()))
        for chip in sample.chips:
            number = chip.get("chip")
            used, total = chip.get("hbm_used"), chip.get("hbm_total")
            hbm = meter(100.0 * used / total if used is not None and total else None,
                        label=format_used_of(used, total))
            trend = [next((item.get("duty_cycle_pct") for item in old.chips if item.get("chip") == number), None)
                     for old in past]
            percents = [Text("n/a", style="dim") if value is None else Text(f"{value:.0f}%")
                        for value in [chip.get("hbm_bandwidth_pct")] + ([chip.get("tensorcore_util_pct")]
                                                                          if tensorcore else [])]
            row(chips, str(number), meter(chip.get("duty_cycle_pct")), hbm, *percents, trend=trend)
        parts.append(chips)
        if sample.unavailable.get("tensorcore"):
            parts.append(Text(f"TensorCore utilisation: {sample.unavailable['tensorcore']}", style="dim"))
    elif sample.unavailable.get("tpu"):
        parts.append(Text.assemble(("TPU  ", "bold"), (sample.unavailable["tpu"], "yellow")))
    host = sample.host
    if host:
        summaries = [summarize(old) for old in past]
        grid = table("host", ("", "now"))
        cores = host.get("cpu_pct") or []
        row(grid, f"CPU ({len(cores)} cores)", meter(summaries[-1].cpu_pct), trend=[item.cpu_pct for item in summaries])
        for index, core in enumerate(cores if len(cores) <= 16 else ()):
            row(grid, Text(f"  core {index}", style="dim"), meter(core))
        row(grid, "memory", meter(summaries[-1].memory_used_pct,
                                  label=format_used_of(host.get("memory_used"), host.get("memory_total"))),
            trend=[item.memory_used_pct for item in summaries])
        for label, rss in (host.get("processes") or {}).items():
            row(grid, f"{label} resident", Text(format_bytes(rss)))
        parts.append(grid)
    if sample.unavailable.get("host"):
        parts.append(Text.assemble(("host  ", "bold"), (sample.unavailable["host"], "yellow")))
    return Group(*parts)


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

    def __call__(self, run, event: Event, timestamp: float | None = None) -> None:
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

    def close(self) -> None:
        pass


class CountColumn(MofNCompleteColumn):
    """``3/10``, and nothing for a task that counts nothing (a stage such as building the model)."""

    def render(self, task) -> Text:
        return Text("") if task.total is None else super().render(task)


class ConsoleSink:
    """The human view of one headless run."""

    def __init__(self, console: Console | None = None, on_output_closed: Callable[[], None] | None = None):
        self.console = console or Console(stderr=False, highlight=False)
        self.on_output_closed = on_output_closed
        self.output_closed = False
        # rich's default raises SystemExit, which would unwind the job from
        # inside whatever it was doing; a cancel stops it at its next step.
        self.console.on_broken_pipe = self._output_went_away
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
        )
        self._tasks: dict[str, int] = {}
        self._stages = StageTimeline()
        self._replicas_printed: set[str] = set()
        self._replicas_updated: dict[str, ReplicaValues] = {}
        self._stage_task: int | None = None
        self._latest: dict[str, float] = {}
        self._started = False
        self._lock = threading.Lock()
        self._devices = DeviceNames()
        """Every device named in this run's tables, in order: they all get short names together."""
        self._per_device_shown: list[tuple[frozenset[str], frozenset[str]]] = []
        """(devices, column keys) of each per-device table printed, so no value is printed twice."""

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

    def _metrics_text(self) -> str:
        shown = list(self._latest.items())[-4:]
        return "  ".join(f"{name} {value:.4g}" for name, value in shown)

    def __call__(self, run, event: Event, timestamp: float | None = None) -> None:
        with self._lock:
            self._render(event, time.time() if timestamp is None else timestamp)

    def _render(self, event: Event, now: float) -> None:
        if isinstance(event, RunStarted):
            runtime = event.runtime
            simulated = " (simulated replicas)" if runtime.get("simulated") else ""
            self.console.print(
                f"[bold]▶ {event.job}[/]  run [cyan]{event.run_id}[/]  on {runtime.get('kind')} · "
                f"{runtime.get('strategy')} · {runtime.get('num_replicas')} replicas{simulated}"
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
            task = self._tasks.get(event.unit)
            if task is None:
                task = self._progress.add_task(event.unit + "s", total=event.total, unit="", metrics="")
                self._tasks[event.unit] = task
            self._progress.update(task, completed=event.done, total=event.total, metrics=self._metrics_text())
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

    def _shown_per_device(self, name: str, devices: Iterable) -> bool:
        """Whether a printed table already has a ``name`` column for each of ``devices``."""
        wanted = {str(device) for device in devices}
        return bool(wanted) and any(column_key(name) in keys and wanted <= shown
                                    for shown, keys in self._per_device_shown)

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
        table.add_column("value")
        for index, (device, value) in enumerate(zip(event.devices, event.values)):
            table.add_row(str(index), names.get(str(device), str(device)), format_value(value))
        self.console.print(table)

    def _print_summary(self, summary: dict) -> None:
        """The summary without the per-device values a table has shown; device names as in the tables."""
        shown = {key for key, value in summary.items()
                 if isinstance(value, dict) and self._shown_per_device(key, value)}
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
        return "  ".join(f"{name} {value:.4g}" for name, value in self._latest.items())

    def _stop_progress(self) -> None:
        if self._started:
            self._progress.stop()
            self._started = False

    def close(self) -> None:
        with self._lock:
            self._stop_progress()


def rich_table(title: str, columns: Iterable, rows: Iterable,
               device_names: Mapping[str, str] | None = None) -> RichTable:
    """A job's result table; ``device_names`` shortens device names (a device column never wraps)."""
    table = RichTable(title=title, title_justify="left")
    for column in columns:
        table.add_column(str(column), no_wrap=column_key(str(column)) == "device")
    for row in rows:
        cells = []
        for cell in row:
            text = format_value(cell, device_names)
            if text in ("PASS", "pass", "True"):
                text = f"[green]{text}[/]"
            elif text in ("FAIL", "fail", "False"):
                text = f"[red]{text}[/]"
            cells.append(text)
        table.add_row(*cells)
    return table


def summary_table(summary: dict, device_names: Mapping[str, str] | None = None) -> RichTable:
    table = RichTable(title="summary", title_justify="left", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in summary.items():
        empty = isinstance(value, (list, dict)) and not value
        table.add_row(str(key), "none" if empty else format_value(value, device_names))
    return table


def fit_columns(table: RichTable, width: int, console: Console, fold: bool = False) -> bool:
    """Size ``table``'s columns to fit ``width`` without cutting a word; False when it cannot.

    rich shrinks the widest columns first and cuts what no longer fits
    ("20261123-09…"); here every column keeps at least its longest word and
    the room left is shared in proportion to what each column could still use.
    ``fold``: when even that is too wide, break the long words of the columns
    that may wrap; a ``no_wrap`` column (an id) is never broken.
    """
    unlimited = console.options.update_width(UNLIMITED_WIDTH)
    spans = []
    for column in table.columns:
        measured = [Measurement.get(console, unlimited, cell) for cell in (column.header, *column.cells)]
        low, high = max(low for low, _ in measured), max(high for _, high in measured)
        spans.append((max(low, column.min_width or 0), max(high, column.min_width or 0)))
    _, right, _, left = table.padding
    borders = (len(spans) + 1 if table.show_edge else len(spans) - 1) if table.box else 0
    padding = (left + right) * len(spans) - (0 if table.pad_edge else left + right)
    room = width - borders - padding
    least, most = sum(low for low, _ in spans), sum(high for _, high in spans)
    if most <= room:
        return True
    if least <= room:
        widths = [low + (high - low) * (room - least) // (most - least) for low, high in spans]
    else:
        kept = sum(low for (low, _), column in zip(spans, table.columns) if column.no_wrap)
        folded = least - kept
        if not fold or room - kept < MIN_FOLDED_WIDTH * (len(spans) - sum(column.no_wrap for column in table.columns)):
            return False
        widths = [low if column.no_wrap else max(MIN_FOLDED_WIDTH, low * (room - kept) // folded)
                  for (low, _), column in zip(spans, table.columns)]
    for column, column_width in zip(table.columns, widths):
        column.width = column_width
        if not column.no_wrap:
            column.overflow = "fold"
    return True


def print_fitted(console: Console, build: Callable[[tuple[str, ...]], RichTable],
                 optional: Iterable[Iterable[str]]) -> None:
    """Print ``build(left_out)`` at the console's width without cutting a word.

    Each group of ``optional`` columns is left out in turn until the table
    fits; if it still does not, the long words of wrapping columns are broken.
    """
    left_out: tuple[str, ...] = ()
    table = build(left_out)
    for group in optional:
        if fit_columns(table, console.width, console):
            break
        left_out += tuple(group)
        table = build(left_out)
    else:
        if not fit_columns(table, console.width, console):
            fit_columns(table, console.width, console, fold=True)
    console.print(table)


def render_host(host_check: dict, console: Console | None = None) -> None:
    from tpudash.accel.hostcheck import host_lines

    console = console or Console()
    for label, text, style in host_lines(host_check):
        console.print(f"[dim]{label}:[/] ", end="")
        console.print(text, style=style or None, markup=False, highlight=False)


def render_devices(description, console: Console | None = None) -> None:
    console = console or Console()
    if description.host_check:
        render_host(description.host_check, console)
    simulated = " (simulated replicas)" if description.simulated else ""
    console.print(f"[bold]{description.kind}[/] · {description.strategy} · "
                  f"{description.num_replicas} replicas in sync{simulated}")
    console.print(f"TensorFlow {description.tf_version} · Keras {description.keras_version} · host {description.host} · "
                  f"initialized in {format_seconds(description.init_seconds)}")
    if description.tpu_address:
        console.print(f"TPU address: {description.tpu_address}")
    if description.topology:
        topology = description.topology
        console.print(f"topology: mesh {topology.get('mesh_shape')} · {topology.get('num_tasks')} tasks · "
                      f"{topology.get('num_tpus_per_task')} cores per task")
    for kind, reason in description.reasons.items():
        console.print(f"[dim]not {kind}:[/] {reason}")
    for note in description.notes:
        console.print(f"[dim]note:[/] {note}")
    # A narrow terminal loses job, replica and task first: the name holds them.
    print_fitted(console, lambda left_out: devices_table(description, left_out), [("job", "replica", "task")])


def devices_table(description, leave_out: Iterable[str] = ()) -> RichTable:
    """The logical devices; a name is what ``tf.device`` takes, so it is never cut."""
    columns = [column for column in ("index", "name", "type", "job", "replica", "task", "memory")
               if column not in leave_out]
    table = RichTable(title="logical devices", title_justify="left")
    for column in columns:
        table.add_column(column, no_wrap=column == "name")
    for device in description.devices:
        cells = {
            "index": str(device.index),
            "name": device.name,
            "type": device.device_type,
            "job": str(device.job or "-"),
            "replica": str(device.replica if device.replica is not None else "-"),
            "task": str(device.task if device.task is not None else "-"),
            "memory": ", ".join(f"{key} {value}" for key, value in device.memory.items()) if device.memory else "-",
        }
        table.add_row(*(cells[column] for column in columns))
    return table


def render_jobs(specs, console: Console | None = None) -> None:
    console = console or Console()
    for spec in specs:
        render_job(spec, console)


def render_job(spec, console: Console) -> None:
    """A job's name, title, description and every param: ``--set name=default``, what it allows, what it does."""
    key = f" [dim](key {spec.key})[/]" if spec.key else ""
    console.print(f"[bold]{spec.name}[/]{key} — {spec.title}")
    console.print(Padding(Text(spec.description, style="dim"), (0, 0, 0, 2)))
    params = RichTable.grid(padding=(0, 2), pad_edge=True)
    params.add_column(no_wrap=True)
    params.add_column(overflow="fold")
    for param in spec.params:
        params.add_row(f"--set {param.name}={param.format(param.default)}",
                       Text.assemble(param.allowed(), (f". {param.help}" if param.help else "", "dim")))
    console.print(params)



def render_runs(runs, runs_dir, console: Console | None = None) -> None:
    console = console or Console()
    if not runs:
        console.print(f"no runs yet in {runs_dir}")
        return
    # A narrow terminal loses the job, then the start: the run id holds both (the start in UTC).
    print_fitted(console, lambda left_out: runs_table(runs, runs_dir, left_out), [("job",), ("started",)])


def runs_table(runs, runs_dir, leave_out: Iterable[str] = ()) -> RichTable:
    """The runs as a table whose run ids are never cut: ``tpudash export`` and ``watch`` need them whole."""
    columns = [column for column in ("run", "job", "started", "duration", "status", "final metrics")
               if column not in leave_out]
    # Rules under the header only, as `kubectl get` lists: room for whole ids.
    table = RichTable(title=f"runs in {runs_dir}", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                      pad_edge=False)
    statuses = [status_text("live" if run.live else run.status) for run in runs]
    for column in columns:
        if column == "run":
            table.add_column(column, no_wrap=True, min_width=max(len(run.run_id) for run in runs))
        elif column == "status":  # the glyph stays beside its word
            table.add_column(column, min_width=max(status.cell_len for status in statuses))
        else:
            table.add_column(column, no_wrap=column == "duration")
    for run, status in zip(runs, statuses):
        if run.live:
            status.append(f" (pid {run.pid}; follow it with tpudash watch)", style="dim")
        if run.problems:
            status.append(f" (! {len(run.problems)} problems)", style="red")
        cells = {
            "run": run.run_id,
            "job": run.job,
            "started": datetime.fromtimestamp(run.started).strftime("%Y-%m-%d %H:%M:%S") if run.started else "-",
            "duration": format_seconds(run.duration),
            "status": status,
            "final metrics": brief_metrics(run.final_metrics),
        }
        table.add_row(*(cells[column] for column in columns))
    return table
