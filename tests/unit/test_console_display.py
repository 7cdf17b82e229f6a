"""What the CLI and the dashboard show alike: a glyph and colour per run status, short device names."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from rich.style import Style

from jobs.events import ReplicaValues, RunFinished, Table
from screens.history import run_status_text
from tpudash.accel.description import LogicalDeviceInfo, RuntimeDescription
from tpudash.cli.render import render_devices, render_runs
from tpudash.cli.sinks import ConsoleSink
from tpudash.format import STATUS_GLYPHS, short_device_names
from tpudash.runs.store import RunInfo
from tpudash.tui.runview import status_text as dashboard_status_text

EVERY_STATUS = ("queued", "running", "live", "done", "failed", "cancelled", "interrupted", "stale")
LOCAL_CPUS = [f"/job:localhost/replica:0/task:0/device:CPU:{index}" for index in range(8)]
# Two hosts of a TPU pod slice: core 0 exists on both tasks.
POD_CORES = [f"/job:worker/replica:0/task:{task}/device:TPU:{core}" for task in range(2) for core in range(4)]


def colour_console(width: int = 120) -> Console:
    return Console(file=io.StringIO(), width=width, force_terminal=True, color_system="truecolor")


def rendered(text) -> str:
    """``text`` as a terminal receives it: characters and colour codes."""
    console = colour_console()
    console.print(text)
    return console.file.getvalue().rstrip("\n")


def test_every_status_has_a_glyph_and_a_colour_of_its_own():
    assert set(STATUS_GLYPHS) == set(EVERY_STATUS)
    glyphs = [glyph for glyph, _ in STATUS_GLYPHS.values()]
    colours = [Style.parse(style).color for _, style in STATUS_GLYPHS.values()]
    assert len(set(glyphs)) == len(glyphs)
    assert len(set(colours)) == len(colours)


@pytest.mark.parametrize("status", ["done", "failed", "cancelled"])
def test_the_line_that_ends_tpudash_run_shows_the_status_as_the_dashboard_does(status):
    console = colour_console()
    ConsoleSink(console)(None, RunFinished(status=status))
    ending = console.file.getvalue().splitlines()[0]
    assert ending == rendered(dashboard_status_text(status))
    assert STATUS_GLYPHS[status][0] in ending


@pytest.mark.parametrize(
    ("status", "live"),
    [("done", False), ("failed", False), ("cancelled", False), ("interrupted", False), ("running", True)],
)
def test_tpudash_runs_and_the_history_screen_show_a_runs_status_alike(status, live):
    info = RunInfo(
        run_id=f"20261123-091500-matmul-{status[:6]}",
        path=Path("unused"),
        job="matmul",
        status=status,
        live=live,
        pid=4242 if live else None,
        started=1.0,
        finished=None if live else 2.0,
    )
    console = colour_console()
    render_runs([info], "/runs", console)
    history_cell = run_status_text(info)
    assert history_cell.plain == f"{STATUS_GLYPHS['live' if live else status][0]} {'live' if live else status}"
    assert rendered(history_cell) in console.file.getvalue()


def test_device_names_are_shortened_to_what_tells_them_apart():
    assert list(short_device_names(LOCAL_CPUS).values()) == [f"CPU:{index}" for index in range(8)]
    pod = short_device_names(POD_CORES)
    assert pod[POD_CORES[0]] == "task:0/TPU:0" and pod[POD_CORES[5]] == "task:1/TPU:1"
    assert len(set(pod.values())) == len(POD_CORES)
    assert short_device_names(["replica 0"]) == {"replica 0": "replica 0"}


def test_a_result_table_at_80_columns_shows_every_device_whole_and_distinct():
    console = Console(file=io.StringIO(), width=80)
    sink = ConsoleSink(console)
    rows = [[name, 1.5e-06, "pass", 0.512, 1234.5] for name in POD_CORES]
    sink(
        None,
        Table(title="matmul check", columns=["device", "relative error", "result", "median ms", "GFLOP/s"], rows=rows),
    )
    lines = console.file.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines)
    shown = [line.split()[1] for line in lines if line.startswith("│ task:")]
    assert shown == [short_device_names(POD_CORES)[name] for name in POD_CORES]


def test_per_replica_values_a_result_table_already_showed_are_not_printed_again():
    console = Console(file=io.StringIO(), width=80)
    sink = ConsoleSink(console)
    sink(
        None,
        Table(
            title="check",
            columns=["device", "GFLOP/s"],
            rows=[[name, 10.0 + index] for index, name in enumerate(LOCAL_CPUS)],
        ),
    )
    sink(None, ReplicaValues(name="gflops", values=[10.0 + index for index in range(8)], devices=LOCAL_CPUS))
    sink(None, ReplicaValues(name="loss", values=[0.5] * 8, devices=LOCAL_CPUS))
    sink(
        None,
        RunFinished(
            status="done",
            summary={"gflops": dict(zip(LOCAL_CPUS, range(8))), "fastest_device": LOCAL_CPUS[7], "failed_devices": []},
        ),
    )
    out = console.file.getvalue()
    assert "gflops" not in out  # neither as a per-replica table nor in the summary
    assert "loss" in out  # values no table has shown are printed
    assert "fastest_device │ CPU:7" in out and "failed_devices │ none" in out


def test_per_replica_values_a_run_keeps_updating_print_once_as_they_come_and_once_at_the_end():
    console = Console(file=io.StringIO(), width=80)
    sink = ConsoleSink(console)
    for epoch in range(1, 6):  # each epoch's validation, per replica
        sink(
            None,
            ReplicaValues(
                name="val loss per replica", values=[epoch + index / 100 for index in range(8)], devices=LOCAL_CPUS
            ),
        )
    sink(None, RunFinished(status="done"))
    out = console.file.getvalue()
    assert out.count("val loss per replica") == 2
    assert "1.07" in out and "5.07" in out and "3.07" not in out  # the first epoch's and the last one's
    assert out.index("5.07") < out.index("✓ done")


def test_tpudash_devices_at_80_columns_shows_every_device_name_whole():
    devices = [
        LogicalDeviceInfo(
            index, name, "TPU", "worker", 0, index // 4, {"bytes_in_use": 123456789, "peak_bytes_in_use": 987654321}
        )
        for index, name in enumerate(POD_CORES)
    ]
    console = Console(file=io.StringIO(), width=80)
    render_devices(RuntimeDescription("TPU", "TPUStrategy", 8, devices, host="tpu-vm"), console)
    out = console.file.getvalue()
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "…" not in out
    for name in POD_CORES:
        assert name in out
    assert "peak_bytes_in_use" in out
