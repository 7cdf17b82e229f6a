"""A run's segments are read in order per writer, and what a writer never leaves is said (issue 38, item 10).

Before, segments 1, 3 and then a late 2 were read as 1, 3, 2 without a
word, and files named like segments but not quite (``-000000004.jsonl``,
``w-00000001.JSONL``) were passed over in silence. Now a follower holds a
writer's segments behind a gap for ``GAP_WAIT_SECONDS``, reads on after it
(at once when the reading is final) naming what is missing, reads a late
segment still (named as read out of order), and names every file that is not
a segment. These tests also pin ``segments``' other branches (listing
schedule, bounded reads, a store that does not answer) for the mutation pass.
"""

from __future__ import annotations

import re

import pytest

from jobs.events import Metric, dumps
from tests.memory_run_files import MemoryFiles, segment
from tpudash.runs import segments
from tpudash.runs.backends import LocalRunFiles
from tpudash.runs.segments import (
    MAX_LIST_SECONDS,
    SEGMENT_PATTERN,
    StreamTail,
    new_writer_id,
    segment_name,
    segment_order,
)


def steps(events) -> list[int | None]:
    return [event.step for _, event in events]


@pytest.fixture
def files() -> MemoryFiles:
    return MemoryFiles()


@pytest.fixture
def now() -> list[float]:
    return [0.0]


def follower(files, now, **options) -> StreamTail:
    """A tail as the dashboard follows a store's run, on a clock the test moves."""
    return StreamTail(files, appends=False, clock=lambda: now[0], **options)


# The review's reproduction: 1, 3, then a late 2.


def test_segments_1_3_then_a_late_2_are_read_as_1_2_3_when_2_comes_within_the_wait(files, now):
    tail = follower(files, now)
    segment(files, "w", 1)
    segment(files, "w", 3)

    first = tail.read_new()
    assert steps(first) == [1]  # 3 is held: 2 is not listed yet
    assert tail.at_end  # nothing more can be read now: a catch-up loop returns
    now[0] = 1.0
    segment(files, "w", 2)
    second = tail.read_new()

    assert steps(second) == [2, 3]
    assert tail.report() == []  # a listing that lagged is not a problem


def test_a_gap_that_does_not_fill_is_read_past_after_the_wait_and_named_and_a_late_segment_still_read(files, now):
    tail = follower(files, now)
    segment(files, "w", 1)
    segment(files, "w", 3)
    assert steps(tail.read_new()) == [1]

    now[0] = 9.99
    assert steps(tail.read_new()) == []  # still held: a follower waits ten seconds for a gap to fill
    now[0] = 10.0
    assert steps(tail.read_new()) == [3]
    assert tail.report() == ["events/w-00000002.jsonl: missing (the writer's next is 00000003); read on without it"]

    now[0] = 11.0
    segment(files, "w", 2)
    assert steps(tail.read_new()) == [2]  # nothing is dropped
    assert tail.report()[1] == (
        "events/w-00000002.jsonl: came late, after w-00000003.jsonl; its events were read after later ones"
    )


def test_a_second_gap_of_the_same_writer_gets_a_wait_of_its_own(files, now):
    tail = follower(files, now)
    segment(files, "w", 1)
    segment(files, "w", 3)
    assert steps(tail.read_new()) == [1]
    now[0] = 1.0
    segment(files, "w", 2)
    assert steps(tail.read_new()) == [2, 3]  # the first gap filled

    now[0] = 30.0
    segment(files, "w", 5)
    assert steps(tail.read_new()) == []  # a new gap: held from now, not from the first one's start
    now[0] = 39.9
    assert steps(tail.read_new()) == []
    now[0] = 40.0
    assert steps(tail.read_new()) == [5]
    assert tail.report() == ["events/w-00000004.jsonl: missing (the writer's next is 00000005); read on without it"]


def test_once_a_gap_is_over_a_quiet_run_is_listed_less_often_again(files, now):
    tail = follower(files, now, list_every=1.0)
    segment(files, "w", 1)
    segment(files, "w", 3)
    tail.read_new()
    now[0] = 1.0
    segment(files, "w", 2)
    tail.read_new()  # the gap filled
    listed_at = []
    for tick in range(11, 200):
        now[0] = tick / 10
        before = tail.listings
        tail.read_new()
        if tail.listings > before:
            listed_at.append(now[0])
    assert listed_at == [2.0, 4.0, 8.0, 16.0]


def test_a_final_read_never_waits_for_a_gap_and_names_it(files):
    segment(files, "w", 1)
    segment(files, "w", 3)
    tail = StreamTail(files, appends=False)

    assert steps(tail.read_all()) == [1, 3]
    assert tail.report() == ["events/w-00000002.jsonl: missing (the writer's next is 00000003); read on without it"]


def test_several_missing_segments_are_one_line_and_a_first_segment_other_than_1_is_a_gap(files):
    segment(files, "a", 2)
    segment(files, "b", 1)
    segment(files, "b", 5)
    segment(files, "c", 1)
    segment(files, "c", 4)
    tail = StreamTail(files, appends=False)

    assert steps(tail.read_all()) == [2, 1, 5, 1, 4]
    assert tail.report() == [
        "events/a-00000001.jsonl: missing (the writer's next is 00000002); read on without it",
        "events/b-00000002.jsonl to -00000004.jsonl: 3 segments missing (the writer's next is 00000005);"
        " read on without them",
        "events/c-00000002.jsonl to -00000003.jsonl: 2 segments missing (the writer's next is 00000004);"
        " read on without them",
    ]


def test_a_gap_in_one_writer_holds_back_only_that_writers_segments(files, now):
    tail = follower(files, now)
    for writer, seq in (("a", 1), ("a", 3), ("b", 1), ("b", 2)):
        segment(files, writer, seq, seq * 10 + (writer == "b"))

    assert steps(tail.read_new()) == [10, 11, 21]
    assert steps(tail.read_new(final=True)) == [30]


def test_writers_are_read_in_name_order_and_each_writers_segments_by_number(files, now):
    tail = follower(files, now)
    segment(files, "b", 1, 100)
    segment(files, "a", 2, 2)
    segment(files, "a", 1, 1)

    assert steps(tail.read_new()) == [1, 2, 100]
    assert tail.report() == []


def test_a_gap_listed_over_two_listings_fills_in_order(files, now):
    tail = follower(files, now, list_every=1.0)
    segment(files, "w", 1)
    assert steps(tail.read_new()) == [1]
    now[0] = 1.0
    segment(files, "w", 3)
    segment(files, "w", 4)
    assert steps(tail.read_new()) == []
    now[0] = 2.0
    segment(files, "w", 2)
    assert steps(tail.read_new()) == [2, 3, 4]
    assert tail.report() == []


def test_while_a_gap_is_open_the_segments_are_listed_every_list_every_not_less_often(files, now):
    tail = follower(files, now, list_every=1.0)
    segment(files, "w", 2)  # 1 is not listed: a gap from the start
    listed_at = []
    for tick in range(90):  # nine seconds of polls, ten a second
        now[0] = tick / 10
        before = tail.listings
        tail.read_new()
        if tail.listings > before:
            listed_at.append(now[0])

    assert listed_at == [float(second) for second in range(9)]
    assert tail.listings == 9


def test_a_quiet_run_is_listed_ever_less_often_up_to_the_cap_and_again_every_second_once_something_comes(files, now):
    tail = follower(files, now, list_every=1.0)
    listed_at = []
    for tick in range(400):  # forty seconds of polls, and nothing new until 30 s
        now[0] = tick / 10
        if tick == 300:
            segment(files, "w", 1)
        before = tail.listings
        tail.read_new()
        if tail.listings > before:
            listed_at.append(now[0])

    # Quiet: 2, 4, then 8 s apart (MAX_LIST_SECONDS); after a new segment, every list_every again, then backing off.
    assert listed_at == [0.0, 2.0, 6.0, 14.0, 22.0, 30.0, 31.0, 33.0, 37.0]
    assert MAX_LIST_SECONDS == 8.0


def test_a_final_read_lists_at_once_whatever_the_schedule(files, now):
    tail = follower(files, now)
    tail.read_new()
    segment(files, "w", 1)
    assert steps(tail.read_new()) == []  # the next listing is not due yet
    assert steps(tail.read_new(final=True)) == [1]
    assert tail.at_end


# Names a writer never gives.

MISNAMED = ["-000000004.jsonl", "w-00000001.JSONL", "w-00000000.jsonl", "w-0000001.jsonl", "w-000000001.jsonl"]


def test_files_not_named_as_segments_are_never_read_and_named_in_one_line(files):
    for name in MISNAMED:
        files.objects[f"events/{name}"] = (dumps(Metric("loss", 9.0, step=99), 9.0) + "\n").encode()
    files.objects["events/.w-00000002.jsonl.1234.tmp"] = b"half written"  # a writer's temporary file
    segment(files, "w", 1)
    tail = StreamTail(files, appends=False)

    assert steps(tail.read_all()) == [1]
    assert tail.report() == [
        "events/: 5 files not named as a segment (<writer>-<8 digits, from 00000001>.jsonl), never read: "
        "'-000000004.jsonl', 'w-00000000.jsonl', 'w-000000001.jsonl', …"
    ]


def test_one_misnamed_file_is_one_file_and_three_are_all_shown(files):
    files.objects["events/x.jsonl"] = b""
    tail = StreamTail(files, appends=False)
    list(tail.read_all())
    assert tail.report() == [
        "events/: 1 file not named as a segment (<writer>-<8 digits, from 00000001>.jsonl), never read: 'x.jsonl'"
    ]

    for name in ("y.jsonl", "z.jsonl"):
        files.objects[f"events/{name}"] = b""
    list(tail.read_all())
    assert tail.report()[0].endswith("never read: 'x.jsonl', 'y.jsonl', 'z.jsonl'")
    assert tail.report()[0].startswith("events/: 3 files not named")


def test_a_long_hostile_name_is_cut_in_its_problem_line(files):
    files.objects["events/" + "x" * 500 + "\n.jsonl"] = b""
    tail = StreamTail(files, appends=False)
    list(tail.read_all())
    (line,) = tail.report()
    assert len(line) < 200 and "\n" not in line


def test_the_misnamed_files_of_a_local_run_are_named_too(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "events" / "w-00000001.jsonl").write_text(dumps(Metric("loss", 1.0, step=1), 1.0) + "\n")
    (run_dir / "events" / "-000000004.jsonl").write_text(dumps(Metric("loss", 1.0, step=4), 4.0) + "\n")
    tail = StreamTail(LocalRunFiles(run_dir))

    assert steps(tail.read_all()) == [1]
    assert tail.report() == [
        "events/: 1 file not named as a segment (<writer>-<8 digits, from 00000001>.jsonl), never read: "
        "'-000000004.jsonl'"
    ]


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("w-00000001.jsonl", ("w", 1)),
        ("tpu-vm-0-4242-1a2b3c-00000012.jsonl", ("tpu-vm-0-4242-1a2b3c", 12)),
        ("a" * 96 + "-99999999.jsonl", ("a" * 96, 99999999)),
        ("a" * 97 + "-00000001.jsonl", None),
        ("w-00000000.jsonl", None),
        ("w-0000001.jsonl", None),
        ("w-000000001.jsonl", None),
        ("-00000001.jsonl", None),
        ("w-00000001.JSONL", None),
        ("w-00000001.jsonl.tmp", None),
        ("w x-00000001.jsonl", None),
        ("w-0000000a.jsonl", None),
        ("w-00000001xjsonl", None),
    ],
)
def test_what_a_segments_name_may_be(name, parsed):
    assert segments.parse_segment_name(name) == parsed
    if parsed is not None:
        assert segment_name(*parsed) == name and segment_order(name) == parsed


def test_a_writer_id_is_this_host_this_process_and_a_token_and_names_segments(monkeypatch):
    import os
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "tpu vm/0" + "x" * 60)
    writer = new_writer_id()

    assert re.fullmatch(rf"tpu_vm_0x{{40}}-{os.getpid()}-[0-9a-f]{{6}}", writer)
    assert SEGMENT_PATTERN.match(segment_name(writer, 1))
    assert new_writer_id() != writer
    monkeypatch.setattr(socket, "gethostname", lambda: "")
    assert new_writer_id().startswith(f"host-{os.getpid()}-")


# Caps and bounded reads.


def test_the_order_problems_kept_are_capped_and_the_rest_counted(files):
    for seq in range(1, 50, 2):  # 1, 3, 5, … 49: a gap before each but the first, 24 in all
        segment(files, "w", seq)
    tail = StreamTail(files, appends=False)
    list(tail.read_all())

    report = tail.report()
    assert len(report) == 21  # twenty kept, and a line for the rest
    assert report[0].startswith("events/w-00000002.jsonl: missing")
    assert report[-1] == "events/: 4 more segments missing or late"


def test_one_more_order_problem_than_the_cap_is_one_segment(files):
    for seq in range(1, 44, 2):  # 21 gaps: one more than the twenty kept
        segment(files, "w", seq)
    tail = StreamTail(files, appends=False)
    list(tail.read_all())
    assert tail.report()[-1] == "events/: 1 more segment missing or late"


def test_a_bounded_read_takes_one_segment_a_call_and_says_when_it_is_at_the_end(files, now):
    for seq in (1, 2, 3):
        segment(files, "w", seq)
    tail = follower(files, now)

    reads = []
    while True:
        reads.append(steps(tail.read_new(max_bytes=1 << 20)))
        if tail.at_end:
            break
    assert reads == [[1], [2], [3]]


def test_the_appended_file_is_read_before_the_segments(files):
    files.objects["events.jsonl"] = (dumps(Metric("loss", 1.0, step=0), 0.0) + "\n").encode()
    segment(files, "w", 1)
    tail = StreamTail(files, appends=False)
    assert steps(tail.read_all()) == [0, 1]


def test_a_store_that_does_not_answer_is_said_and_asked_again_later_and_no_event_is_read_twice(files, now):
    segment(files, "w", 1)
    tail = follower(files, now)
    files.down = True

    assert steps(tail.read_new()) == []
    assert tail.unreachable == "StoreDown: the store is unreachable"
    files.down = False
    now[0] = MAX_LIST_SECONDS - 0.1
    assert steps(tail.read_new()) == [] and files.listings == 0  # the next listing waits MAX_LIST_SECONDS
    now[0] = MAX_LIST_SECONDS
    assert steps(tail.read_new()) == [1]
    assert tail.unreachable is None


def test_a_segment_the_store_fails_to_send_is_read_again_whole_at_the_next_call(files, now):
    segment(files, "w", 1, 1, 2, 3)
    segment(files, "w", 2)
    tail = follower(files, now)
    original_open = files.open
    failures = iter([True])

    def failing_open(name):
        if name.startswith("events/") and next(failures, False):
            raise ConnectionError("reset by peer")
        return original_open(name)

    files.open = failing_open  # type: ignore[method-assign]
    assert steps(tail.read_new()) == []
    assert tail.unreachable == "ConnectionError: reset by peer"
    assert steps(tail.read_new()) == [1, 2, 3, 2]
    assert tail.report() == []


def test_a_segment_listed_then_removed_is_passed_over_without_a_gap(files, now):
    segment(files, "w", 1)
    segment(files, "w", 2)
    tail = follower(files, now)
    original_open = files.open

    def gone_open(name):
        if name == "events/w-00000001.jsonl":
            raise FileNotFoundError(name)  # a spill directory emptied by its upload meanwhile
        return original_open(name)

    files.open = gone_open  # type: ignore[method-assign]
    assert steps(tail.read_new()) == [2]
    assert tail.report() == []


def test_a_bad_line_in_a_segment_and_a_gap_are_both_reported(files):
    files.objects["events/w-00000001.jsonl"] = b"not json\n"
    segment(files, "w", 3)
    tail = StreamTail(files, appends=False)
    list(tail.read_all())
    assert tail.report() == [
        "1 event could not be read: w-00000001.jsonl line 1: truncated or not JSON",
        "events/w-00000002.jsonl: missing (the writer's next is 00000003); read on without it",
    ]


def test_telemetry_segments_are_named_by_their_own_stream(files):
    segment(files, "w", 2, stream="telemetry")
    tail = StreamTail(files, "telemetry", appends=False)
    list(tail.read_all())
    assert tail.report() == ["telemetry/w-00000001.jsonl: missing (the writer's next is 00000002); read on without it"]
