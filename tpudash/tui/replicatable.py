"""The run view's Replicas tab in words: its table of every replica's values and the note above its chart.

``replica_table_layout`` fits the table to its width (a column per replica, or a row per replica for
values too wide to sit side by side, such as replica-matmul's matrices), ``fill_replica_table`` draws
it, and ``replica_note`` says what the tab shows instead of a chart (all zeros, no numbers, none yet).
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.widgets import DataTable

from tpudash.format import format_value
from tpudash.runs.model import RunModel
from tpudash.tui.runheader import clipped

MOST_ROWS = 200
"""The newest values per replica the table lists."""


def fill_replica_table(table: DataTable, model: RunModel, width: int) -> None:
    """Redraw ``table`` with the newest per-replica values of ``model``, laid out for ``width`` cells."""
    table.clear(columns=True)
    replicas = list(model.replicas.values())[-MOST_ROWS:]
    count = max((len(event.values) for event in replicas), default=0)
    if not count:
        return
    rows = [[format_value(value) for value in event.values] for event in replicas]
    value_names = [event.name for event in replicas]
    layout = replica_table_layout(value_names, rows, count, width)
    if layout.transposed:  # a row per replica, a column per value: wide values (matrices) whole
        table.add_column("replica", key="replica", width=layout.name_width)
        for index, (name, column_width) in enumerate(zip(value_names, layout.column_widths)):
            table.add_column(name, key=f"v{index}", width=column_width)
        for replica, label in enumerate(layout.labels):
            table.add_row(label, *(cells[replica] if replica < len(cells) else "" for cells in rows))
        return
    table.add_column("value", key="name", width=layout.name_width)
    for index, label in enumerate(layout.labels):
        table.add_column(label, key=f"r{index}", width=layout.cell_width)
    for name, cells in zip(value_names, rows):
        cells = [clipped(cell, layout.cell_width) for cell in cells]
        table.add_row(clipped(name, layout.name_width), *(cells + [""] * (count - len(cells))))


@dataclass(frozen=True)
class ReplicaTableLayout:
    """How the per-replica table fits its width: its columns' labels and widths (cells, padding aside).

    Either a column per replica (``labels`` head them, the first column names the values), or
    ``transposed``: a row per replica (``labels`` begin the rows) and a column per value name
    (``column_widths``), for values too wide to sit side by side (replica-matmul's matrices).
    """

    name_width: int
    labels: list[str]
    cell_width: int
    transposed: bool = False
    column_widths: tuple[int, ...] = ()


CELL_PADDING = 2  # DataTable's, either side of a cell together
MIN_NAME = 12
"""A value's name keeps this many characters (or all of it) before its values give up theirs."""
MAX_TRANSPOSED_COLUMNS = 12


def replica_table_layout(names: list[str], rows: list[list[str]], count: int, width: int) -> ReplicaTableLayout:
    """Every replica within ``width`` (issue 26, 5.25: at 80 columns 8 replicas showed 5), values whole
    when they fit anyhow (issue 38: ``prod…`` and ``[[22, 28], […`` beside half a screen of room).

    In order: a column per replica headed ``replica N``, everything whole; headed ``rN``, the values whole
    and the names given the rest (down to ``MIN_NAME``); a row per replica and a column per value, everything
    whole; else ``rN`` columns sharing the width evenly, values cut only there.
    """
    widths = [max((len(cell) for cell in row), default=1) for row in rows]
    widest_cell = max(widths, default=1)
    widest_name = max(len("value"), *(len(name) for name in names))
    full = [f"replica {index}" for index in range(count)]
    cell = max(widest_cell, len(full[-1]))
    if widest_name + CELL_PADDING + count * (cell + CELL_PADDING) <= width:
        return ReplicaTableLayout(widest_name, full, cell)
    short = [f"r{index}" for index in range(count)]
    cell = max(widest_cell, len(short[-1]))
    name_room = width - CELL_PADDING - count * (cell + CELL_PADDING)
    if name_room >= min(widest_name, MIN_NAME):
        return ReplicaTableLayout(min(widest_name, name_room), short, cell)
    column_widths = tuple(max(len(name), value_width) for name, value_width in zip(names, widths))
    first = len(full[-1])
    if (
        len(names) <= MAX_TRANSPOSED_COLUMNS
        and first + CELL_PADDING + sum(column + CELL_PADDING for column in column_widths) <= width
    ):
        return ReplicaTableLayout(first, full, widest_cell, transposed=True, column_widths=column_widths)
    name_width = min(widest_name, MIN_NAME)
    room = (width - name_width - CELL_PADDING) // count - CELL_PADDING
    return ReplicaTableLayout(name_width, short, max(min(cell, room), len(short[-1]), 3))


def replica_note(model: RunModel) -> str | None:
    """What the Replicas tab says instead of a chart, or None when the latest numbers make one.

    A chart of nothing but zeros is an empty box (plotext draws −1 to 1):
    the sentence says it better. A run that ended without values says why.
    """
    if model.latest_numeric_replica:
        event = model.replicas[model.latest_numeric_replica]
        if any(value != 0 for value in event.values):
            return None
        count = len(event.values)
        return f"{event.name} is exactly 0 on {f'all {count} replicas' if count > 1 else 'the one replica'}."
    if model.replicas:
        return "No numbers to chart per replica; the table below lists each replica's values."
    if not model.finished_state:
        return "Per-replica values: waiting for data."
    why = {
        "done": f"{model.job or 'the job'} does not report values per replica; its results are under Plots and Results",
        "failed": "it failed before reporting any (the error is above; the traceback is in Log)",
        "cancelled": "it was cancelled before reporting any",
        "interrupted": "its process ended before reporting any",
    }.get(model.status, f"it ended ({model.status}) without reporting any")
    return f"This run reported no per-replica values: {why}."
