"""The one staleness rule (``tpudash.runs.heartbeat``) at its boundaries, and reading a folder of heartbeats newest first.

Every boundary is pinned on both sides: the last age that is live and the
first that is stale, the furthest ahead that is live and the first that is
"clock ahead", the intervals a heartbeat may state. What a reader of a
folder of heartbeats gets: the newest first, hidden files and folders left
out, and junk counted in one problem line.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tpudash.runs import heartbeat
from tpudash.runs.backends import LocalRunFiles, listed_time, runs_root
from tpudash.runs.heartbeat import (
    CLOCK_AHEAD,
    CLOCK_SKEW_SECONDS,
    LIVE,
    MAX_HEARTBEAT_BYTES,
    STALE,
    STALE_AFTER_INTERVALS,
    STOPPED,
    Junk,
    add_problem,
    ahead_words,
    interval_or,
    judge,
    listed_newest_first,
    parse_beat,
    seconds_words,
    stale_after,
    why_not_a_beat,
)

NOW = 1_800_000_000.0


def test_the_rules_constants_are_what_the_docs_say() -> None:
    assert (STALE_AFTER_INTERVALS, CLOCK_SKEW_SECONDS, MAX_HEARTBEAT_BYTES) == (3, 5.0, 4096)
    assert heartbeat.INTERVAL_RANGE_SECONDS == (0.01, 600.0)
    assert stale_after(5.0) == 15.0 and stale_after(0.5) == 1.5


@pytest.mark.parametrize(
    ("age", "state"),
    [
        (0.0, LIVE),
        (15.0, LIVE),  # three intervals exactly: still live
        (15.000001, STALE),
        (1e12, STALE),
        (-CLOCK_SKEW_SECONDS, LIVE),  # as far ahead as the clocks may disagree
        (-CLOCK_SKEW_SECONDS - 0.000001, CLOCK_AHEAD),
        (-1e300, CLOCK_AHEAD),
    ],
)
def test_a_heartbeat_is_live_stale_or_clock_ahead_by_its_age(age: float, state: str) -> None:
    assert judge(NOW - age, 5.0, NOW) == state


def test_the_stale_bound_is_in_the_writers_own_intervals() -> None:
    assert judge(NOW - 1.5, 0.5, NOW) == LIVE and judge(NOW - 1.51, 0.5, NOW) == STALE
    assert judge(NOW - 1800, 600.0, NOW) == LIVE and judge(NOW - 1801, 600.0, NOW) == STALE


@pytest.mark.parametrize("age", [0.0, 3600.0, -3600.0])
def test_a_writer_that_said_it_stopped_is_stopped_whatever_its_age(age: float) -> None:
    assert judge(NOW - age, 5.0, NOW, stopped=True) == STOPPED


@pytest.mark.parametrize(
    ("stated", "used"),
    [(0.01, 0.01), (600, 600.0), (5, 5.0), (0.0099, 7.0), (600.01, 7.0), (None, 7.0), ("5", 7.0), (True, 7.0)],
)
def test_a_heartbeats_interval_is_its_own_only_within_the_range(stated: object, used: float) -> None:
    assert interval_or(stated, 7.0) == used
    assert type(interval_or(stated, 7.0)) is float


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "0 s"),
        (89.4, "89 s"),
        (-89.4, "89 s"),
        (90, "2 min"),
        (89 * 60, "89 min"),
        (90 * 60, "2 h"),
        (47 * 3600, "47 h"),
        (48 * 3600, "2 d"),
        (365 * 86400, "365 d"),
        (365 * 86400 + 1, "more than a year"),
        (1e300, "more than a year"),
    ],
)
def test_how_far_apart_two_clocks_are_in_words(seconds: float, words: str) -> None:
    assert seconds_words(seconds) == words


def test_a_heartbeat_from_the_future_is_named_with_how_far_ahead() -> None:
    assert ahead_words(NOW + 7200, NOW) == "its heartbeat is 2 h ahead of this clock (not counted as live)"


def a_beat(**fields: object) -> bytes:
    return json.dumps(fields).encode()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (a_beat(interval=5), "no heartbeat time in it"),
        (a_beat(heartbeat="soon"), "no heartbeat time in it"),
        (a_beat(heartbeat=True), "no heartbeat time in it"),
        (b'{"heartbeat": NaN}', "no heartbeat time in it"),
        (b" " * (MAX_HEARTBEAT_BYTES + 1), f"larger than {MAX_HEARTBEAT_BYTES} bytes"),
    ],
)
def test_what_is_no_heartbeat_is_refused_and_said_why(data: bytes, why: str) -> None:
    assert parse_beat(data) is None
    assert why_not_a_beat(data) == why


def test_a_heartbeat_of_exactly_the_largest_size_is_read() -> None:
    data = a_beat(heartbeat=NOW)
    padded = data[:-1] + b" " * (MAX_HEARTBEAT_BYTES - len(data)) + b"}"
    assert len(padded) == MAX_HEARTBEAT_BYTES
    assert parse_beat(padded) == {"heartbeat": NOW}
    assert why_not_a_beat(b"x" * MAX_HEARTBEAT_BYTES) == "not JSON"  # at the cap: read, and found no JSON


# -- a folder of heartbeats ------------------------------------------------------------------------------


def write_at(folder: Path, name: str, stamp: float) -> None:
    (folder / name).write_bytes(b"{}")
    os.utime(folder / name, (stamp, stamp))


def test_a_local_folder_is_listed_newest_first_without_hidden_files_links_or_folders(tmp_path: Path) -> None:
    folder = tmp_path / "writers"
    folder.mkdir()
    write_at(folder, "a.json", NOW - 30)
    write_at(folder, "b.json", NOW)
    write_at(folder, "c.json", NOW - 10)
    write_at(folder, "d.json", NOW - 10)  # a tie: by name
    write_at(folder, ".b.json.1.2.tmp", NOW + 5)  # a write under way
    (folder / "sub").mkdir()
    (folder / "link.json").symlink_to(folder / "a.json")

    assert listed_newest_first(LocalRunFiles(tmp_path), "writers") == ["b.json", "c.json", "d.json", "a.json"]
    assert listed_newest_first(LocalRunFiles(tmp_path), "nothing-here") == []


def test_a_stores_folder_is_listed_newest_first_by_the_time_its_listing_gives() -> None:
    root = runs_root(f"memory://beats-{uuid.uuid4().hex[:8]}/runs")
    files = root.files("run")
    for name in ("b.json", "a.json", "c.json"):
        files.write(f"writers/{name}", b"{}")
    files.write("writers/sub/x.json", b"{}")

    assert listed_newest_first(files, "writers") == ["c.json", "a.json", "b.json"]
    assert listed_newest_first(files, "nothing-here") == []


class NamesOnly:
    """A kind of RunFiles whose listing gives names only (every time 0: unknown)."""

    def list_by_time(self, folder: str) -> list[tuple[float, str]]:
        return [(0.0, "b.json"), (0.0, ".hidden"), (0.0, "a.json")]


def test_files_whose_listing_gives_no_time_are_listed_by_name() -> None:
    assert listed_newest_first(NamesOnly(), "writers") == ["a.json", "b.json"]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("entry", "stamp"),
    [
        ({"mtime": 12.5}, 12.5),
        ({"LastModified": datetime(2026, 11, 28, tzinfo=timezone.utc)}, 1795824000.0),
        ({"updated": "2026-11-28T00:00:00.000Z"}, 1795824000.0),
        ({"updated": "yesterday", "created": 7.0}, 7.0),
        ({"created": True}, 0.0),
        ({}, 0.0),
    ],
)
def test_a_listings_time_is_read_from_what_each_store_calls_it(entry: dict, stamp: float) -> None:
    assert listed_time(entry) == stamp


def test_junk_is_counted_and_the_first_few_named_in_one_line() -> None:
    junk = Junk("writers", "heartbeats")
    assert junk.line() is None
    junk.add("a.json", "not JSON")
    assert junk.line() == "writers/: 1 file is no heartbeats (a.json: not JSON); skipped"
    junk.add("b.json", "not JSON")
    junk.add("c")
    assert junk.line() == "writers/: 3 files are no heartbeats (a.json: not JSON; b.json: not JSON; c); skipped"
    junk.add("d.json", "not JSON")
    assert junk.count == 4 and len(junk.named) == 3
    assert junk.line() == "writers/: 4 files are no heartbeats (a.json: not JSON; b.json: not JSON; c; …); skipped"


def test_a_problem_about_a_file_replaces_the_earlier_one_about_it() -> None:
    problems = ["run.json: pid must be a process id", "writers/x.json: its heartbeat is 2 h ahead"]
    add_problem(problems, "writers/x.json: its heartbeat is 3 h ahead")
    add_problem(problems, None)
    add_problem(None, "writers/y.json: whatever")
    assert problems == ["run.json: pid must be a process id", "writers/x.json: its heartbeat is 3 h ahead"]
