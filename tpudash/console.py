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
from typing import IO, Callable, Iterable

from rich.console import Console, Group
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
    Table,
    Telemetry,
    dumps,
)

LEVEL_STYLES = {"debug": "dim", "info": "", "warning": "yellow", "error": "bold red"}
STATUS_STYLES = {"done": "bold green", "failed": "bold red", "cancelled": "bold yellow",
                 "interrupted": "bold magenta", "running": "cyan"}


def format_value(value) -> str:
    """Numbers compact, matrices and lists as nested brackets."""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(item) for item in value) + "]"
    return str(value)


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


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
    from tpudash.telemetry import summarize

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
            MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[metrics]}"),
            console=self.console,
            transient=True,
        )
        self._tasks: dict[str, int] = {}
        self._latest: dict[str, float] = {}
        self._started = False
        self._lock = threading.Lock()

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
            self._render(event)

    def _render(self, event: Event) -> None:
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
            style = LEVEL_STYLES.get(event.level, "")
            prefix = "" if event.level == "info" else f"{event.level}: "
            self.console.print(f"{prefix}{event.text}", style=style or None, markup=False, highlight=False)
        elif isinstance(event, ProgressEvent):
            task = self._tasks.get(event.unit)
            if task is None:
                task = self._progress.add_task(event.unit + "s", total=event.total, unit="", metrics="")
                self._tasks[event.unit] = task
            self._progress.update(task, completed=event.done, total=event.total, metrics=self._metrics_text())
            if event.unit == "epoch" and self._latest:
                self.console.print(f"epoch {event.done}/{event.total}  {self._epoch_line()}", highlight=False)
        elif isinstance(event, Metric):
            key = event.name if event.split == "train" else f"{event.split}_{event.name}"
            self._latest[key] = event.value
            if event.split == "test":
                self.console.print(f"test {event.name}: {event.value:.6g}", highlight=False)
        elif isinstance(event, Table):
            self.console.print(rich_table(event.title, event.columns, event.rows))
        elif isinstance(event, ReplicaValues):
            table = RichTable(title=event.name, title_justify="left")
            table.add_column("replica", justify="right")
            table.add_column("device")
            table.add_column("value")
            for index, (device, value) in enumerate(zip(event.devices, event.values)):
                table.add_row(str(index), str(device), format_value(value))
            self.console.print(table)
        elif isinstance(event, Artifact):
            self.console.print(f"[dim]{event.kind}:[/] {event.path}")
        elif isinstance(event, RunFinished):
            self._stop_progress()
            style = STATUS_STYLES.get(event.status, "bold")
            self.console.print(f"[{style}]■ {event.status}[/]")
            if event.error:
                self.console.print(f"error: {event.error}", style="red", markup=False)
            if event.summary:
                self.console.print(summary_table(event.summary))

    def _epoch_line(self) -> str:
        return "  ".join(f"{name} {value:.4g}" for name, value in self._latest.items())

    def _stop_progress(self) -> None:
        if self._started:
            self._progress.stop()
            self._started = False

    def close(self) -> None:
        with self._lock:
            self._stop_progress()


def rich_table(title: str, columns: Iterable, rows: Iterable) -> RichTable:
    table = RichTable(title=title, title_justify="left")
    for column in columns:
        table.add_column(str(column))
    for row in rows:
        cells = []
        for cell in row:
            text = format_value(cell)
            if text in ("PASS", "pass", "True"):
                text = f"[green]{text}[/]"
            elif text in ("FAIL", "fail", "False"):
                text = f"[red]{text}[/]"
            cells.append(text)
        table.add_row(*cells)
    return table


def summary_table(summary: dict) -> RichTable:
    table = RichTable(title="summary", title_justify="left", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in summary.items():
        table.add_row(str(key), format_value(value))
    return table


def render_host(host_check: dict, console: Console | None = None) -> None:
    from tpudash.hostcheck import host_lines

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
                  f"initialized in {description.init_seconds:.2f}s")
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
    table = RichTable(title="logical devices", title_justify="left")
    for column in ("index", "name", "type", "job", "replica", "task", "memory"):
        table.add_column(column)
    for device in description.devices:
        memory = "-" if not device.memory else ", ".join(f"{key} {value}" for key, value in device.memory.items())
        table.add_row(str(device.index), device.name, device.device_type, str(device.job or "-"),
                      str(device.replica if device.replica is not None else "-"),
                      str(device.task if device.task is not None else "-"), memory)
    console.print(table)


def render_jobs(specs, console: Console | None = None) -> None:
    console = console or Console()
    for spec in specs:
        key = f" [dim](key {spec.key})[/]" if spec.key else ""
        console.print(f"[bold]{spec.name}[/]{key} — {spec.title}")
        console.print(f"  {spec.description}", style="dim", markup=False)
        for param in spec.params:
            console.print(f"  --set {param.name}={param.format(param.default)}  [dim]{param.allowed()}. {param.help}[/]",
                          highlight=False)


def render_runs(runs, runs_dir, console: Console | None = None) -> None:
    console = console or Console()
    if not runs:
        console.print(f"no runs yet in {runs_dir}")
        return
    table = RichTable(title=f"runs in {runs_dir}", title_justify="left")
    for column in ("run", "job", "started", "duration", "status", "final metrics"):
        table.add_column(column)
    for run in runs:
        started = datetime.fromtimestamp(run.started).strftime("%Y-%m-%d %H:%M:%S") if run.started else "-"
        metrics = "  ".join(f"{name} {value:.4g}" for name, value in list(run.final_metrics.items())[:4]
                            if isinstance(value, (int, float)))
        status = f"[{STATUS_STYLES.get(run.status, '')}]{'live' if run.live else run.status}[/]"
        if run.live:
            status += f" [dim](pid {run.pid}; tpudash watch {run.run_id[:22]})[/]"
        if run.problems:
            status += f" [red](! {len(run.problems)} problems)[/]"
        table.add_row(run.run_id, run.job, started, format_seconds(run.duration), status, metrics)
    console.print(table)
