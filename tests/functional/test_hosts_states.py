"""The Hosts view's states by the one staleness rule: live, stale, stopped (its agent stopped cleanly), clock ahead.

A snapshot of the four at 160×48 and 80×24 (test_hosts_view.py's fixed
dashboard and clock), and what a user reads in them under Pilot: a stopped
host's last figures are not shown as current, a heartbeat from the future
is never live, and folders that hold no host.json are counted in the title
while the host that reports is shown.
"""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

from screens import hosts as hosts_screen
from tests.functional.test_hosts_view import (  # noqa: F401 - fixtures are used by name
    NOW,
    SIZES,
    hosts_app,
    hosts_shown,
    row_text,
    tpu_host,
)
from tests.functional.test_snapshots import fixed_app  # noqa: F401 - the fixture is used by name
from tpudash.runs.hosts import HostStatus


def four_hosts() -> list[HostStatus]:
    """A busy host, one silent for a minute, one whose agent was stopped, and one whose clock is 2 h ahead."""
    stopped = dataclasses.replace(tpu_host("tpu-vm-2", 180, [40, 0, 12, 77], 100.0), stopped=True)
    return [
        tpu_host("tpu-vm-0", 3, [96, 91, 88, 94], 63.0),
        tpu_host("tpu-vm-1", 64, [10, 10, 10, 10], 5.0),
        stopped,
        tpu_host("tpu-vm-3", -7200, [50, 50, 50, 50], 30.0),
    ]


@pytest.mark.parametrize("size", SIZES)
def test_the_four_states_match_their_snapshot(snap_compare, hosts_app, size):  # noqa: F811
    assert snap_compare(hosts_app(four_hosts()), terminal_size=SIZES[size], run_before=hosts_shown)


async def test_a_stopped_host_says_so_without_its_last_figures_and_a_clock_ahead_is_never_live(hosts_app):  # noqa: F811
    app = hosts_app(four_hosts())
    async with app.run_test(size=(160, 48)) as pilot:
        await hosts_shown(pilot)
        table = app.screen.query_one("#hosts-table")
        stopped = row_text(table, "tpu-vm-2")
        assert "stopped 3 min ago" in stopped and "agent stopped" in stopped
        assert "100%" not in stopped and "GiB" not in stopped, "a stopped host's last figures shown as current"
        ahead = row_text(table, "tpu-vm-3")
        assert "clock ahead 2 h" in ahead and "live" not in ahead
        assert "stale" in row_text(table, "tpu-vm-1") and "live 3 s ago" in row_text(table, "tpu-vm-0")
        title = str(app.screen.query_one("#hosts-title").render())
        assert "4 hosts" in title and "1 stale" in title and "1 stopped" in title and "1 clock ahead" in title


async def test_empty_host_folders_are_counted_and_never_hide_the_host_that_reports(fixed_app, monkeypatch):  # noqa: F811
    from tests.functional.test_snapshots import RUNS_DIR
    from tpudash.runs.hosts import MAX_HOSTS, host_record

    monkeypatch.setattr(hosts_screen, "wall_clock", lambda: NOW)
    app = fixed_app()  # writes the runs directory afresh
    (RUNS_DIR / "hosts" / "tpu-vm-0").mkdir(parents=True)
    (RUNS_DIR / "hosts" / "tpu-vm-0" / "host.json").write_bytes(host_record(tpu_host("tpu-vm-0", 1, [50], 20.0)))
    for number in range(MAX_HOSTS):
        os.mkdir(RUNS_DIR / "hosts" / f"a{number:04d}")
    async with app.run_test(size=(120, 30)) as pilot:
        await hosts_shown(pilot)
        table = app.screen.query_one("#hosts-table")
        assert table.row_count == 1 and "live" in row_text(table, "tpu-vm-0")
        title = str(app.screen.query_one("#hosts-title").render())
        assert re.search(r"hosts/: 1,024 folders hold no host\.json \(a\d{4}, a\d{4}, a\d{4}, …\); skipped", title)
