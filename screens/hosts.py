"""The Hosts screen: one row per host that runs ``tpudash agent`` into this runs directory (or bucket).

Each row: the host's name, its chips (how many, their mean duty cycle, a
bar of each chip's duty cycle, HBM used of total), its CPU and memory, how
long ago its last heartbeat was and its state by the one staleness rule
(``tpudash.runs.heartbeat``: live, stale, stopped when its agent stopped
cleanly, clock ahead when its heartbeat is from the future; in words, not
only in colour), and the runs it samples (or why it has no chips). A
stopped host shows no figures: its last ones are not current.
``hosts/<name>/host.json`` is read off the UI thread every
``READ_SECONDS`` while the screen is shown; a read updates the rows in place
(a cell is touched only when its text changed). From 1 host to 64 the table
scrolls; on a narrow terminal (80 columns) the columns that matter least go
first: the per-chip bar, then memory. An empty store says how to start an
agent; a store that cannot be read says so and keeps the rows last read.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from rich.cells import cell_len
from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.message import Message
from textual.widgets import DataTable, Static
from textual.worker import Worker, WorkerState

from screens.base import DashScreen
from tpudash.format import counted, format_timestamp, format_used_of, sparkline
from tpudash.runs.heartbeat import CLOCK_AHEAD, STALE, STOPPED, seconds_words, stale_after
from tpudash.runs.hosts import HOST_INTERVAL_SECONDS

if TYPE_CHECKING:
    from tpudash.runs.hosts import HostStatus

READ_SECONDS = 2.0
"""How often the shown screen reads the hosts: under an agent's interval, so a new heartbeat shows within 2 s."""
STALE_AFTER_SECONDS = stale_after(HOST_INTERVAL_SECONDS)
PER_CHIP_BAR_CHIPS = 16
"""Up to this many chips a host's per-chip bar has a cell per chip; beyond it the busiest chip is named instead."""
HOST_NAME_WIDTH = 20
RUNS_MIN_WIDTH = 10
AGENT_COMMAND = "tpudash agent --runs-dir {where}"
TPU_VMS_COMMAND = 'gcloud compute tpus tpu-vm ssh NAME --worker=all --command "tpudash agent --runs-dir {where}"'

# (key, title), left to right; "runs" takes what the others leave.
HOST_COLUMNS = (
    ("host", "host"),
    ("heartbeat", "heartbeat"),
    ("chips", "chips"),
    ("duty", "duty"),
    ("per_chip", "per chip"),
    ("hbm", "HBM"),
    ("cpu", "CPU"),
    ("memory", "memory"),
    ("runs", "runs"),
)
RESERVED_WIDTHS = {"heartbeat": cell_len("stopped 99 min ago"), "duty": cell_len("100%"), "cpu": cell_len("100%")}
"""Room kept for the cells that change on every read, so an age going from 9 s to 10 s refits no column."""
DROPPED_FIRST = ("per_chip", "memory", "chips", "cpu")
"""The columns a narrow terminal gives up, in this order, until the rest (and some room for runs) fit."""


def wall_clock() -> float:
    """Now, as heartbeats are stamped (tests fix it)."""
    return time.time()


class HostsSource(Protocol):
    def read(self, now: float | None = None) -> list[HostStatus]: ...


def open_hosts_reader(runs_dir: object) -> HostsSource:
    """The reader of ``<runs dir>/hosts`` (tests give their own)."""
    from tpudash.runs.hosts import HostsReader

    return HostsReader(runs_dir)  # type: ignore[arg-type]


# -- cells -------------------------------------------------------------------------------------


def format_age(seconds: float) -> str:
    """``4 s ago``, ``12 min ago``, ``3 h ago``: how long since a heartbeat, to the unit that reads at a glance."""
    seconds = max(0.0, seconds)
    if seconds < 100:
        return f"{seconds:.0f} s ago"
    if seconds < 100 * 60:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} d ago"


def format_percent(percent: float | None) -> str:
    return "" if percent is None else f"{percent:.0f}%"


def heartbeat_text(host: HostStatus, now: float) -> Text:
    """``live 2 s ago``, ``stale 41 s ago``, ``stopped 3 min ago``, ``clock ahead 2 h``: the state, then the age."""
    state = host.state(now)
    if state == STALE:
        return Text.assemble(("stale ", "bold red"), (format_age(host.age(now)), "red"))
    if state == STOPPED:
        return Text.assemble(("stopped ", "bold yellow"), (format_age(host.age(now)), "yellow"))
    if state == CLOCK_AHEAD:
        return Text.assemble(("clock ahead ", "bold magenta"), (seconds_words(host.heartbeat - now), "magenta"))
    return Text.assemble(("live ", "bold green"), format_age(host.age(now)))


def duty_cycles(host: HostStatus) -> list[float]:
    return [chip.duty_cycle for chip in host.chips if chip.duty_cycle is not None]


def mean_duty_text(host: HostStatus) -> str:
    measured = duty_cycles(host)
    return format_percent(sum(measured) / len(measured)) if measured else ""


def per_chip_text(host: HostStatus) -> Text:
    """A cell per chip, as high as its duty cycle; for a big host, its busiest chip."""
    if not host.chips:
        return Text("")
    if len(host.chips) <= PER_CHIP_BAR_CHIPS:
        return sparkline([chip.duty_cycle for chip in host.chips], width=PER_CHIP_BAR_CHIPS)
    busiest = max(host.chips, key=lambda chip: -1.0 if chip.duty_cycle is None else chip.duty_cycle)
    if busiest.duty_cycle is None:
        return Text("")
    return Text(f"max {busiest.duty_cycle:.0f}% (#{busiest.index})")


def hbm_text(host: HostStatus) -> str:
    used = [chip.hbm_used for chip in host.chips if chip.hbm_used is not None]
    total = [chip.hbm_total for chip in host.chips if chip.hbm_total is not None]
    if not used and not total:
        return ""
    return format_used_of(sum(used) if used else None, sum(total) if total else None)


def runs_text(host: HostStatus) -> Text:
    """The runs it samples; before them, why it has no chip figures (in yellow)."""
    text = Text()
    if host.problem:
        text.append(f"⚠ {host.problem}", style="yellow")
    if host.runs:
        if text:
            text.append("; ")
        text.append(", ".join(host.runs))
    return text


def host_cells(host: HostStatus, now: float) -> dict[str, Text | str]:
    """Every column's cell for ``host`` as of ``now``; a stopped host's figures are blank (they are not current)."""
    if host.state(now) == STOPPED:
        return {
            "host": host.name,
            "heartbeat": heartbeat_text(host, now),
            "chips": str(len(host.chips)) if host.chips else "none",
            **dict.fromkeys(("duty", "per_chip", "hbm", "cpu", "memory"), ""),
            "runs": Text("agent stopped", style="dim"),
        }
    return {
        "host": host.name,
        "heartbeat": heartbeat_text(host, now),
        "chips": str(len(host.chips)) if host.chips else "none",
        "duty": mean_duty_text(host),
        "per_chip": per_chip_text(host),
        "hbm": hbm_text(host),
        "cpu": format_percent(host.cpu_percent),
        "memory": format_used_of(host.memory_used, host.memory_total),
        "runs": runs_text(host),
    }


def cell_width(cell: Text | str) -> int:
    return cell_len(cell.plain if isinstance(cell, Text) else cell)


def fit_columns(widths: dict[str, int], room: int, padding: int) -> tuple[list[str], int]:
    """The columns that fit in ``room`` cells (each with ``padding`` cells around), and the runs column's width.

    Every column keeps its widest cell; the runs column takes what is left
    (at least ``RUNS_MIN_WIDTH``). Until that fits, the columns of
    ``DROPPED_FIRST`` go, in its order.
    """
    keys = [key for key, _ in HOST_COLUMNS]
    for dropping in (None, *DROPPED_FIRST):
        if dropping is not None:
            keys.remove(dropping)
        fixed = sum(widths[key] + padding for key in keys if key != "runs")
        left = room - fixed - padding
        if left >= RUNS_MIN_WIDTH:
            return keys, left
    return keys, RUNS_MIN_WIDTH


# -- messages from the reading thread -----------------------------------------------------------------


class HostsRead(Message):
    """Every host's status as of ``now`` (posted from the reading worker)."""

    def __init__(self, hosts: Sequence[HostStatus], now: float, skipped: Sequence[str] = ()):
        super().__init__()
        self.hosts = list(hosts)
        self.now = now
        self.skipped = list(skipped)
        """The host.json files the reader skipped, each with why."""


class HostsUnreadable(Message):
    """The store could not be listed or read (posted from the reading worker)."""

    def __init__(self, error: BaseException, now: float):
        super().__init__()
        self.error = error
        self.now = now


class HostsScreen(DashScreen):
    """Every host of the store: chips, CPU, memory, heartbeat, the runs it samples."""

    CSS_PATH = "hosts.tcss"

    def __init__(self) -> None:
        super().__init__()
        self.hosts: dict[str, HostStatus] = {}
        """The hosts last read, by name."""
        self.read_at: float | None = None
        """When the hosts were last read successfully (the clock of ``wall_clock``)."""
        self.read_error: str | None = None
        """Why the last read failed; None after a good one."""
        self.skipped: list[str] = []
        """The host.json files the last read skipped (another host's file that fails its checks), with why."""
        self.rows_rebuilt = 0
        """How often the table was cleared and refilled (the columns changed), for tests and benchmarks."""
        self.redraw_seconds: list[float] = []
        """How long each redraw after a read took on the UI thread (benchmarks read it)."""
        self._reader: HostsSource | None = None
        self._reading: Worker | None = None
        self._shown_cells: dict[str, dict[str, Text | str]] = {}
        self._columns: tuple[tuple[str, ...], int] = ((), 0)

    def compose_body(self) -> ComposeResult:
        yield Static("", id="hosts-title")
        yield Static("", id="hosts-empty")
        yield DataTable(id="hosts-table", zebra_stripes=True, cursor_type="row")
        yield Static("", id="hosts-detail")

    def on_mount(self) -> None:
        self.set_interval(READ_SECONDS, self._read_if_shown, name="tpudash hosts read")
        self._show_title()

    def on_screen_resume(self, event: events.ScreenResume) -> None:
        # (DashScreen's handler runs too: Textual calls each class's own.)
        self.read_now()

    def on_resize(self, event: events.Resize) -> None:
        # The columns were fitted to the old width: fit them again once the table has its new size.
        self.call_after_refresh(self._show_hosts)

    # -- reading --------------------------------------------------------------------------
    def _read_if_shown(self) -> None:
        if self.is_current:
            self.read_now()

    def read_now(self) -> Worker | None:
        """Start a read unless one is under way (a slow bucket's reads never pile up); the worker started."""
        if self._reading is not None and self._reading.is_running:
            return None
        self._reading = self.read_hosts()
        return self._reading

    @work(
        thread=True,
        exit_on_error=False,
        group="hosts-read",
        description="Read every host's heartbeat and latest sample from the store",
    )
    def read_hosts(self) -> None:
        try:
            if self._reader is None:
                self._reader = open_hosts_reader(self.dashboard.session.runs_dir)
            hosts = self._reader.read(wall_clock())
        except Exception as error:  # noqa: BLE001 - any failure of the store is shown on the screen, rows kept
            self.post_message(HostsUnreadable(error, wall_clock()))
            return
        # Judged as of the read's end: a heartbeat written while a slow store answered is not from the future.
        self.post_message(HostsRead(hosts, wall_clock(), getattr(self._reader, "problems", ())))

    def on_hosts_read(self, message: HostsRead) -> None:
        started = time.perf_counter()
        self.hosts = {host.name: host for host in message.hosts}
        self.read_at, self.read_error, self.skipped = message.now, None, message.skipped
        self._show_hosts()
        self.redraw_seconds.append(time.perf_counter() - started)

    def on_hosts_unreadable(self, message: HostsUnreadable) -> None:
        self.read_error = f"{type(message.error).__name__}: {message.error}"
        self._show_title()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if event.state == WorkerState.ERROR:
            self.app.notify(
                f"{type(worker.error).__name__}: {worker.error}", title=worker.description, severity="error"
            )

    # -- drawing -------------------------------------------------------------------------
    @property
    def where(self) -> str:
        return self.dashboard.session.store.where

    def _show_hosts(self) -> None:
        if self.read_at is None:
            return
        table = self.query_one("#hosts-table", DataTable)
        cells = {name: host_cells(host, self.read_at) for name, host in sorted(self.hosts.items())}
        # The cells' room, with a vertical scrollbar's kept in reserve: more hosts change no width.
        room = (table.size.width or self.app.size.width) - table.styles.scrollbar_size_vertical
        widths = {
            key: max(
                [cell_width(title), RESERVED_WIDTHS.get(key, 0), *(cell_width(row[key]) for row in cells.values())]
            )
            for key, title in HOST_COLUMNS
        }
        widths["host"] = min(widths["host"], HOST_NAME_WIDTH)
        keys, runs_width = fit_columns(widths, room, 2 * table.cell_padding)
        columns = (tuple(keys), runs_width)
        for row in cells.values():
            for key in ("host", "runs"):
                cell = row[key]
                cut = Text(cell) if isinstance(cell, str) else cell.copy()
                cut.truncate(HOST_NAME_WIDTH if key == "host" else runs_width, overflow="ellipsis")
                row[key] = cut
        if columns != self._columns:
            self._columns = columns
            self._rebuild(table, keys, dict(widths, runs=runs_width), cells)
        else:
            self._update_in_place(table, keys, cells)
        self._shown_cells = cells
        self.query_one("#hosts-empty", Static).display = not cells
        table.display = bool(cells)
        self._show_title()
        self._show_detail()

    def _rebuild(self, table: DataTable, keys: list[str], widths: dict[str, int], cells: dict[str, dict]) -> None:
        cursor_row = table.cursor_row
        table.clear(columns=True)
        titles = dict(HOST_COLUMNS)
        for key in keys:
            # Fixed widths, the reserved room included: a cell updated in place never widens its column, so a
            # heartbeat turning from ``live 1 s ago`` to ``stale 11 s ago`` must already fit.
            table.add_column(titles[key], key=key, width=widths[key])
        for name, row in cells.items():
            table.add_row(*(row[key] for key in keys), key=name)
        if table.row_count:
            table.move_cursor(row=min(cursor_row, table.row_count - 1))
        self.rows_rebuilt += 1

    def _update_in_place(self, table: DataTable, keys: list[str], cells: dict[str, dict]) -> None:
        """Touch only the cells whose text changed; add new hosts, remove gone ones."""
        for name in [name for name in self._shown_cells if name not in cells]:
            table.remove_row(name)
        added = False
        for name, row in cells.items():
            shown = self._shown_cells.get(name)
            if shown is None:
                table.add_row(*(row[key] for key in keys), key=name)
                added = True
                continue
            for key in keys:
                if row[key] != shown[key]:
                    table.update_cell(name, key, row[key])
        if added:  # a host that appears takes its place by name, as the reader orders them
            table.sort("host", key=lambda cell: str(cell))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self._show_detail()

    def _show_detail(self) -> None:
        """The highlighted host in full, under the table: what a narrow terminal cuts (its problem, its runs)."""
        detail = self.query_one("#hosts-detail", Static)
        table = self.query_one("#hosts-table", DataTable)
        host = None
        if table.row_count:
            row_key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
            host = self.hosts.get(str(row_key.value))
        detail.display = host is not None
        if host is None:
            return
        text = Text.assemble((host.name, "bold"), f" ({host.hostname})" if host.hostname != host.name else "")
        if host.problem:
            text.append(f" · ⚠ {host.problem}", style="yellow")
        text.append(" · runs: " + (", ".join(host.runs) if host.runs else "none live"))
        detail.update(text)

    def _show_title(self) -> None:
        title = self.query_one("#hosts-title", Static)
        empty = self.query_one("#hosts-empty", Static)
        where = self.where
        text = Text()
        if self.read_at is None and self.read_error is None:
            text.append(f"Reading the hosts in {where}…", style="dim")
        else:
            states = [host.state(self.read_at) for host in self.hosts.values() if self.read_at is not None]
            text.append(counted(len(self.hosts), "host"), style="bold")
            text.append(f" in {where}")
            for state, style in ((STALE, "bold red"), (STOPPED, "bold yellow"), (CLOCK_AHEAD, "bold magenta")):
                if states.count(state):
                    text.append(f"   {states.count(state)} {state}", style=style)
            hint = f"   stale after {STALE_AFTER_SECONDS:g} s without a heartbeat · read every {READ_SECONDS:g} s"
            if text.cell_len + cell_len(hint) <= title.content_size.width:  # one line: else Help says it
                text.append(hint, style="dim")
        if self.skipped:
            text.append(f"\n⚠ {self.skipped[0]}", style="yellow")
            if len(self.skipped) > 1:
                text.append(f" (and {len(self.skipped) - 1} more)", style="yellow")
        if self.read_error is not None:
            last = (
                f"the rows read at {format_timestamp(self.read_at, '%H:%M:%S')} are kept"
                if self.read_at is not None
                else "nothing read yet"
            )
            text.append(f"\nCannot read the hosts: {self.read_error} ({last})", style="bold red")
        title.update(text)
        empty.update(
            Text.assemble(
                ("No host reports here yet. ", "bold"),
                "Start an agent on each host; it writes a heartbeat every "
                f"{HOST_INTERVAL_SECONDS:g} s and needs no inbound port:\n\n  ",
                (AGENT_COMMAND.format(where=where), "bold cyan"),
                "\n\nOn every VM of a TPU slice at once:\n\n  ",
                (TPU_VMS_COMMAND.format(where=where), "cyan"),
            )
        )
