"""The headless commands' rich output: result tables, what ``devices``, ``jobs`` and ``runs`` print, a run's workers.

Every table is sized to the terminal without cutting a word: a name or a
run id is what the user copies into the next command. Into a pipe or a file
(``output_console``) nothing is sized to 80 columns: every line is as long
as what it says, with no spaces padding its end. The rules for values,
device names and statuses are ``tpudash.format``'s, shared with the
dashboard; the run sinks (``tpudash.cli.sinks``) print a run with these tables.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, cast

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table as RichTable
from rich.text import Text

from tpudash.format import (
    WORKER_STATE_STYLES,
    brief_metrics,
    column_key,
    counted,
    format_seconds,
    format_timestamp,
    format_value,
    heartbeat_age,
    status_text,
    worker_progress,
    worker_state,
    worker_step_time,
    worker_task,
    workers_heading,
)

if TYPE_CHECKING:
    from pathlib import Path

    from jobs.base import JobSpec
    from tpudash.accel.description import RuntimeDescription
    from tpudash.runs.store import RunInfo
    from tpudash.runs.workers import WorkerStatus

# Wide enough that rich measures a table without squeezing it.
UNLIMITED_WIDTH = 10_000
# The narrowest a column whose words are broken may get.
MIN_FOLDED_WIDTH = 4
# Spaces that end a line, before the style codes that may close it (FORCE_COLOR into a pipe).
TRAILING_SPACES = re.compile(r" +((?:\x1b\[[0-9;]*m)*)\n")


class PipedOutput:
    """Standard output that is no terminal, as rich's file: every line written without the spaces that end it.

    rich pads a table's cells and a padded block to their width; on a
    terminal that is invisible, in a pipe or a file every such line ends in
    blanks (``tpudash jobs | cat -A``). Spaces at the end of a write are held
    back until the next shows whether the line goes on (``label: `` then its
    value) or ends there.
    """

    def __init__(self, stream: IO[str] | None = None):
        self._stream = stream
        self._held = ""

    @property
    def stream(self) -> IO[str]:
        """The stream written to: standard output as it is now, unless one was given."""
        return self._stream or sys.stdout

    def write(self, text: str) -> int:
        joined = TRAILING_SPACES.sub(r"\1\n", self._held + text)
        kept = joined.rstrip(" ")
        self._held = joined[len(kept) :]
        if kept:
            self.stream.write(kept)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"


def output_console(**options: Any) -> Console:
    """The console a command prints its output on: standard output, at the terminal's width or, piped, unwrapped.

    Into a pipe or a file rich would wrap every line at 80 columns (``on
    TensorFlow⏎2.21.0``) and cut a table's cell (a TensorBoard path) to
    fit: there, lines are as long as what they say, so ``grep`` finds a
    value whole, and end without padding (``PipedOutput``).
    """
    console = Console(**options)
    if console.is_terminal or console.is_jupyter:
        return console
    return Console(file=cast("IO[str]", PipedOutput()), width=UNLIMITED_WIDTH, soft_wrap=True, **options)


def rich_table(
    title: str, columns: Iterable, rows: Iterable, device_names: Mapping[str, str] | None = None
) -> RichTable:
    """A job's result table; ``device_names`` shortens device names (a device column never wraps)."""
    table = RichTable(title=title, title_justify="left")
    for column in columns:
        # A long value (a path, a matrix) folds at a narrow terminal rather than ending in "…".
        device = column_key(str(column)) == "device"
        table.add_column(str(column), no_wrap=device, overflow="ellipsis" if device else "fold")
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


def summary_table(summary: Mapping[str, Any], device_names: Mapping[str, str] | None = None) -> RichTable:
    table = RichTable(title="summary", title_justify="left", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value", overflow="fold")  # a TensorBoard path whole, over several lines if it must
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
        widths = [
            low if column.no_wrap else max(MIN_FOLDED_WIDTH, low * (room - kept) // folded)
            for (low, _), column in zip(spans, table.columns)
        ]
    for column, column_width in zip(table.columns, widths):
        column.width = column_width
        if not column.no_wrap:
            column.overflow = "fold"
    return True


def print_fitted(
    console: Console, build: Callable[[tuple[str, ...]], RichTable], optional: Iterable[Iterable[str]]
) -> None:
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


def render_host(host_check: dict[str, Any], console: Console | None = None, framework: str = "tensorflow") -> None:
    from tpudash.accel.hostcheck import host_lines

    console = console or output_console()
    for label, text, style in host_lines(host_check, framework):
        console.print(f"[dim]{label}:[/] ", end="")
        console.print(text, style=style or None, markup=False, highlight=False)


def render_devices(description: RuntimeDescription, console: Console | None = None) -> None:
    console = console or output_console()
    if description.host_check:
        render_host(description.host_check, console, description.framework)
    simulated = " (simulated replicas)" if description.simulated else ""
    # The description's own words (a cluster's worker, a pod's hosts × chips), as the Devices screen shows them.
    console.print(
        Text.assemble(
            (description.kind, "bold"),
            f" · {description.strategy_text()} · {counted(description.num_replicas, 'replica')} in sync{simulated}",
        )
    )
    console.print(
        f"{description.framework_text()} · Keras {description.keras_version} · host {description.host} · "
        f"initialized in {format_seconds(description.init_seconds)}",
        markup=False,
        highlight=False,
    )
    cluster = description.cluster_text()
    if cluster:
        console.print(labelled("cluster", cluster))
    if description.tpu_address:
        console.print(labelled("TPU address", description.tpu_address))
    topology = description.topology_text()
    if topology:
        console.print(labelled("TPU topology", topology))
        hosts = (description.topology or {}).get("host_addresses") or []
        if len(hosts) > 1:
            console.print(labelled("TPU hosts", ", ".join(str(host) for host in hosts)))
    for kind, reason in description.reasons.items():
        console.print(f"[dim]not {kind}:[/] {reason}")
    for note in description.notes:
        console.print(f"[dim]note:[/] {note}")
    # A narrow terminal loses job, replica and task first (the name holds them); on JAX, coords and process.
    optional = [("coords", "process")] if description.framework == "jax" else [("job", "replica", "task")]
    print_fitted(console, lambda left_out: devices_table(description, left_out), optional)


def labelled(label: str, text: str) -> Text:
    """``label: text``, the text as it is (an address or a mesh such as ``[2, 2, 4, 1]`` is no markup)."""
    return Text.assemble((f"{label}: ", "dim"), text)


TENSORFLOW_DEVICE_COLUMNS = ("index", "name", "type", "job", "replica", "task", "memory")
JAX_DEVICE_COLUMNS = ("index", "name", "platform", "kind", "process", "coords", "memory")
"""One row per ``jax.devices()`` entry: its id as a name (``CPU:3``), platform, ``device_kind``, process index, coords."""


def devices_table(description: RuntimeDescription, leave_out: Iterable[str] = ()) -> RichTable:
    """The logical devices (JAX's devices on JAX); a name is what ``tf.device`` takes, so it is never cut."""
    on_jax = description.framework == "jax"
    every = JAX_DEVICE_COLUMNS if on_jax else TENSORFLOW_DEVICE_COLUMNS
    columns = [column for column in every if column not in leave_out]
    table = RichTable(title="JAX devices" if on_jax else "logical devices", title_justify="left")
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
            "platform": device.platform or "-",
            "kind": device.device_kind or "-",
            "process": str(device.process_index if device.process_index is not None else "-"),
            "coords": ",".join(str(value) for value in device.coords) if device.coords is not None else "-",
            "memory": ", ".join(f"{key} {value}" for key, value in device.memory.items()) if device.memory else "-",
        }
        table.add_row(*(cells[column] for column in columns))
    return table


def render_jobs(specs: Iterable[JobSpec], console: Console | None = None) -> None:
    console = console or output_console()
    for spec in specs:
        render_job(spec, console)


def render_job(spec: JobSpec, console: Console) -> None:
    """A job's name, title, description, the frameworks it runs on (why not JAX) and every param:
    ``--set name=default``, what it allows, what it does."""
    key = f" [dim](key {spec.key})[/]" if spec.key else ""
    console.print(f"[bold]{spec.name}[/]{key} — {spec.title}")
    console.print(Padding(Text(spec.description, style="dim"), (0, 0, 0, 2), expand=False))
    console.print(Padding(frameworks_text(spec), (0, 0, 0, 2), expand=False))
    params = RichTable.grid(padding=(0, 2), pad_edge=True)
    params.add_column(no_wrap=True)
    params.add_column(overflow="fold")
    for param in spec.params:
        params.add_row(
            f"--set {param.name}={param.format(param.default)}",
            Text.assemble(param.allowed(), (f". {param.help}" if param.help else "", "dim")),
        )
    console.print(params)


def frameworks_text(spec: JobSpec) -> Text:
    """``runs on: TensorFlow, JAX``; a job without a JAX runner says why: ``runs on: TensorFlow (not on JAX: …)``."""
    from tpudash.config import FRAMEWORK_NAMES

    names = ", ".join(FRAMEWORK_NAMES.get(name, name) for name in spec.frameworks())
    text = Text.assemble(("runs on: ", "dim"), names)
    if "jax" not in spec.frameworks():
        text.append(f" (not on JAX: {spec.not_on_jax or 'no JAX runner'})", "yellow")
    return text


def render_runs(runs: Sequence[RunInfo], runs_dir: Path | str, console: Console | None = None) -> None:
    """The runs as a table sized to the terminal; into a pipe or a file, one line per run, however long."""
    console = console or output_console()
    if not runs:
        console.print(f"no runs yet in {runs_dir}")
        return
    if not console.is_terminal:
        # `tpudash runs | grep mnist`, `| awk`: a value split over two lines is lost to them.
        columns, rows = runs_cells(runs)
        for line in aligned_lines([list(columns), *([row[column] for column in columns] for row in rows)]):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    # A narrow terminal loses the name, then the start (the run id holds the job and the start, in UTC), then
    # the MFU (`tpudash runs --json` and `tpudash advise RUN` have it).
    print_fitted(console, lambda left_out: runs_table(runs, runs_dir, left_out), [("name",), ("started",), ("MFU",)])


def newest_first(runs: Iterable[RunInfo]) -> list[RunInfo]:
    """The runs newest first by their start, as the History screen lists them (a run id counts only to the second)."""
    return sorted(runs, key=lambda info: (info.started or 0.0, info.run_id), reverse=True)


RUNS_COLUMNS = ("run", "name", "started", "duration", "status", "MFU", "final metrics")
WORKERS_COLUMN = "workers"
"""How many workers of a training cluster wrote a run: a column only when some run listed has them."""


def runs_cells(runs: Sequence[RunInfo]) -> tuple[tuple[str, ...], list[dict[str, Text]]]:
    """Each run's cells by column, as ``tpudash runs`` shows them."""
    columns: tuple[str, ...] = RUNS_COLUMNS
    if any(run.workers for run in runs):
        columns = (*RUNS_COLUMNS[:2], WORKERS_COLUMN, *RUNS_COLUMNS[2:])
    rows = []
    for run in runs:
        status = status_text("live" if run.live else run.status)
        if run.live:
            status.append(f" (pid {run.pid}; follow it with tpudash watch)", style="dim")
        if run.problems:
            status.append(f" (! {counted(len(run.problems), 'problem')})", style="red")
        cells: dict[str, str | Text] = {
            "run": run.run_id,
            "name": run.name or run.job,
            "started": format_timestamp(run.started) if run.started is not None else "-",
            "duration": format_seconds(run.duration),
            "status": status,
            "MFU": mfu_cell(run.mfu),
            "final metrics": brief_metrics(run.final_metrics),
            WORKERS_COLUMN: counted(run.workers, "worker") if run.workers else "-",
        }
        rows.append({column: Text(value) if isinstance(value, str) else value for column, value in cells.items()})
    return columns, rows


def mfu_cell(mfu: float | None) -> str:
    """A run's MFU (a fraction) as a runs list shows it, ``22.9 %``, as ``Mfu.text`` says it; ``—`` unmeasured."""
    return "—" if mfu is None else f"{mfu * 100:.3g} %"


def aligned_lines(rows: Sequence[Sequence[Text | str]]) -> list[Text]:
    """``rows`` as lines of columns two spaces apart, each column as wide as its widest cell; nothing wraps."""
    texts = [[cell if isinstance(cell, Text) else Text(cell) for cell in row] for row in rows]
    widths = [max(row[index].cell_len for row in texts) for index in range(len(texts[0]))] if texts else []
    lines = []
    for row in texts:
        line = Text()
        for index, cell in enumerate(row):
            line.append_text(cell)
            if index < len(row) - 1:
                line.append(" " * (widths[index] - cell.cell_len + 2))
        line.rstrip()
        lines.append(line)
    return lines


def runs_table(runs: Sequence[RunInfo], runs_dir: Path | str, leave_out: Iterable[str] = ()) -> RichTable:
    """The runs as a table whose run ids are never cut: ``tpudash export`` and ``watch`` need them whole."""
    all_columns, rows = runs_cells(runs)
    columns = [column for column in all_columns if column not in leave_out]
    # Rules under the header only, as `kubectl get` lists: room for whole ids.
    table = RichTable(
        title=f"runs in {runs_dir}", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False
    )
    for column in columns:
        if column == "run":
            table.add_column(column, no_wrap=True, min_width=max(len(run.run_id) for run in runs))
        elif column == "status":  # the glyph stays beside its word
            words = [status_text("live" if run.live else run.status) for run in runs]
            table.add_column(column, min_width=max(word.cell_len for word in words))
        elif column in (WORKERS_COLUMN, "MFU"):  # "3 workers", "22.9 %" whole
            table.add_column(column, no_wrap=True, min_width=max(row[column].cell_len for row in rows))
        else:
            table.add_column(column, no_wrap=column == "duration")
    for row in rows:
        table.add_row(*(row[column] for column in columns))
    return table


# -- a run's workers (``tpudash watch``) ---------------------------------------------------------

WORKER_FIELDS = ("worker", "task", "host", "progress", "step time", "heartbeat", "state")


def worker_cells(status: WorkerStatus) -> dict[str, str]:
    """A worker's line by field (``WORKER_FIELDS``), in the run view's words, each saying what it is on a line."""
    step_time = worker_step_time(status.step_seconds)
    return {
        "worker": f"worker {status.index}",
        "task": worker_task(status),
        "host": status.host,
        "progress": worker_progress(status) if status.progress or status.step is not None else "no progress yet",
        "step time": f"{step_time}/step" if status.step_seconds is not None else "no step time yet",
        "heartbeat": f"beat {heartbeat_age(status.age)}",
        "state": worker_state(status),
    }


def workers_lines(statuses: Sequence[WorkerStatus]) -> list[Text]:
    """The heading, then one aligned line per worker, its state in words (and styled: never colour alone)."""
    from tpudash.runs.workers import STRAGGLER_MARGIN

    rows: list[list[Text | str]] = []
    for status in statuses:
        cells = worker_cells(status)
        row: list[Text | str] = [cells[name] for name in WORKER_FIELDS[:-1]]
        row.append(Text(cells["state"], style=WORKER_STATE_STYLES.get(cells["state"], "")))
        rows.append(row)
    return [
        workers_heading(statuses, STRAGGLER_MARGIN, explain=True),
        *(Text("  ") + line for line in aligned_lines(rows)),
    ]
