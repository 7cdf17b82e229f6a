"""The Hosts view (``n``): snapshots with 3 hosts at 80×24 and 160×48, and 64 hosts under Pilot.

The dashboard is test_snapshots.py's fixed one (fixed runs directory, UTC,
no engine process, no telemetry sampling); the hosts come from a reader
this module gives the screen, with heartbeats stamped against a fixed
clock, so a snapshot is the same on every machine. The Pilot tests also
read real ``hosts/<name>/host.json`` files through ``HostsReader``.
"""

from __future__ import annotations

import re

import pytest

from screens import hosts as hosts_screen
from tests.functional.test_snapshots import fixed_app, settled  # noqa: F401 - the fixture is used by name
from tpudash.runs.hosts import HOST_INTERVAL_SECONDS, STALE_AFTER_INTERVALS, ChipStatus, HostStatus

NOW = 1_795_003_600.0
GIB = 1024**3
SIZES = {"80x24": (80, 24), "160x48": (160, 48)}
RUN_A = "20261118-081500-train-5f6a7b"
RUN_B = "20261118-082010-train-8c9d0e"


def tpu_host(
    name: str, age: float, duties: list[float], cpu: float, runs: tuple[str, ...] = (), now: float = NOW
) -> HostStatus:
    """A v5e-style host: a chip per duty cycle, 16 GiB of HBM each, its heartbeat ``age`` seconds before ``now``."""
    chips = tuple(ChipStatus(index, duty, int((2 + duty / 10) * GIB), 16 * GIB) for index, duty in enumerate(duties))
    return HostStatus(
        name=name,
        hostname=f"{name}.internal",
        heartbeat=now - age,
        interval=HOST_INTERVAL_SECONDS,
        cpu_percent=cpu,
        memory_used=int(41.5 * GIB),
        memory_total=188 * GIB,
        chips=chips,
        runs=runs,
        problem=None,
    )


def three_hosts() -> list[HostStatus]:
    """A busy host, one whose metrics service is down, and one whose agent stopped a minute ago."""
    unreachable = HostStatus(
        name="tpu-vm-1",
        hostname="tpu-vm-1.internal",
        heartbeat=NOW - 2,
        interval=HOST_INTERVAL_SECONDS,
        cpu_percent=12.0,
        memory_used=int(9.8 * GIB),
        memory_total=188 * GIB,
        chips=(),
        runs=(RUN_A,),
        problem="libtpu's metrics service at localhost:8431 does not answer",
    )
    return [
        tpu_host("tpu-vm-0", 3, [96, 91, 88, 94], 63.0, runs=(RUN_A, RUN_B)),
        unreachable,
        tpu_host("tpu-vm-2", 64, [40, 0, 12, 77], 4.0),
    ]


class FixedHosts:
    """The hosts the screen reads: a list the test may change between reads."""

    def __init__(self, hosts: list[HostStatus]):
        self.hosts = hosts
        self.reads = 0

    def read(self, now: float | None = None) -> list[HostStatus]:
        self.reads += 1
        return sorted(self.hosts, key=lambda host: host.name)


@pytest.fixture
def hosts_app(fixed_app, monkeypatch):  # noqa: F811 - test_snapshots' fixture, by name
    """``hosts_app(hosts)`` → the fixed dashboard whose Hosts view reads ``hosts`` at NOW (the FixedHosts is kept)."""
    clock = {"now": NOW}
    monkeypatch.setattr(hosts_screen, "wall_clock", lambda: clock["now"])

    def make(hosts: list[HostStatus]):
        source = FixedHosts(hosts)
        monkeypatch.setattr(hosts_screen, "open_hosts_reader", lambda runs_dir: source)
        app = fixed_app()
        app.hosts_source, app.hosts_clock = source, clock
        return app

    return make


async def hosts_shown(pilot) -> None:
    """``n`` pressed, the hosts read in the worker and drawn."""
    await settled(pilot)
    await pilot.press("n")
    await read_again(pilot)


async def read_again(pilot) -> None:
    screen = pilot.app.screen
    worker = screen.read_now()
    if worker is not None:
        await worker.wait()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES)
def test_hosts_view_matches_its_snapshot(snap_compare, hosts_app, size):
    assert snap_compare(hosts_app(three_hosts()), terminal_size=SIZES[size], run_before=hosts_shown)


def visible_text(table) -> str:
    """The table's lines as drawn now: what a user sees of it."""
    return "\n".join(table.render_line(y).text for y in range(table.size.height))


def row_text(table, name: str) -> str:
    return " ".join(str(cell) for cell in table.get_row(name))


async def test_sixty_four_hosts_scroll_to_the_last_and_a_silent_host_turns_stale(hosts_app):
    many = [tpu_host(f"host-{index:02d}", 1 + index % 4, [10.0 + index, 50.0, 90.0, 20.0], 30.0) for index in range(64)]
    app = hosts_app(many)
    async with app.run_test(size=(80, 24)) as pilot:
        await hosts_shown(pilot)
        screen = app.screen
        assert type(screen).__name__ == "HostsScreen"
        table = screen.query_one("#hosts-table")
        assert table.row_count == 64
        assert "64 hosts" in str(screen.query_one("#hosts-title").render())
        assert "host-00" in visible_text(table) and "host-63" not in visible_text(table)
        await pilot.press("ctrl+end")
        await pilot.pause()
        assert "host-63" in visible_text(table)
        assert "live" in row_text(table, "host-63")
        rebuilt = screen.rows_rebuilt

        # host-05's agent stops: its heartbeat stays where it was while the clock goes on.
        stale_after = STALE_AFTER_INTERVALS * HOST_INTERVAL_SECONDS
        later = NOW + stale_after
        app.hosts_clock["now"] = later
        app.hosts_source.hosts = [
            host if host.name == "host-05" else tpu_host(host.name, 1, [10.0, 50.0, 90.0, 20.0], 30.0, now=later)
            for host in many
        ]
        await read_again(pilot)
        assert "stale" in row_text(table, "host-05")
        assert sum("stale" in row_text(table, f"host-{index:02d}") for index in range(64)) == 1
        assert "1 stale" in str(screen.query_one("#hosts-title").render())
        assert screen.rows_rebuilt == rebuilt, "a read with the same columns updates the rows in place"
        await pilot.press("ctrl+home")
        await pilot.pause()
        # Updated in place, the longer text is drawn whole at 80 columns: its column had the room kept for it.
        assert re.search(r"host-05 +stale \d+ s ago ", visible_text(table)), visible_text(table)


async def test_an_empty_store_says_how_to_start_an_agent(hosts_app):
    app = hosts_app([])
    async with app.run_test(size=(80, 24)) as pilot:
        await hosts_shown(pilot)
        empty = str(app.screen.query_one("#hosts-empty").render())
        assert "tpudash agent --runs-dir /tmp/tpudash-snapshots/runs" in empty
        assert not app.screen.query_one("#hosts-table").display


class BrokenStore(FixedHosts):
    def read(self, now: float | None = None) -> list[HostStatus]:
        if self.reads:
            raise OSError("the bucket answered 503")
        return super().read(now)


async def test_a_store_that_cannot_be_read_says_so_and_keeps_the_rows(hosts_app, monkeypatch):
    app = hosts_app([])
    source = BrokenStore(three_hosts())
    monkeypatch.setattr(hosts_screen, "open_hosts_reader", lambda runs_dir: source)
    async with app.run_test(size=(120, 30)) as pilot:
        await hosts_shown(pilot)
        table = app.screen.query_one("#hosts-table")
        assert table.row_count == 3
        await read_again(pilot)
        title = str(app.screen.query_one("#hosts-title").render())
        assert "Cannot read the hosts: OSError: the bucket answered 503" in title
        assert "kept" in title
        assert table.row_count == 3 and table.display


async def test_the_view_reads_the_host_files_agents_write(fixed_app, monkeypatch):  # noqa: F811
    """No reader of the test's: ``hosts/<name>/host.json`` in the runs directory, one of them not an agent's."""
    from tests.functional.test_snapshots import RUNS_DIR
    from tpudash.runs.hosts import host_record

    monkeypatch.setattr(hosts_screen, "wall_clock", lambda: NOW)
    app = fixed_app()  # writes the runs directory afresh
    for host in three_hosts():
        (RUNS_DIR / "hosts" / host.name).mkdir(parents=True)
        (RUNS_DIR / "hosts" / host.name / "host.json").write_bytes(host_record(host))
    (RUNS_DIR / "hosts" / "tpu-vm-9").mkdir()
    (RUNS_DIR / "hosts" / "tpu-vm-9" / "host.json").write_text('{"name": "tpu-vm-9", "heartbeat": "soon"}')
    async with app.run_test(size=(120, 30)) as pilot:
        await hosts_shown(pilot)
        table = app.screen.query_one("#hosts-table")
        assert table.row_count == 3
        assert "stale" in row_text(table, "tpu-vm-2") and "live" in row_text(table, "tpu-vm-0")
        assert "92%" in row_text(table, "tpu-vm-0")
        title = str(app.screen.query_one("#hosts-title").render())
        assert "skipped" in title and "tpu-vm-9" in title
        assert "History" not in title and "hosts" not in [info.run_id for info in app.session.store.list_runs()]
