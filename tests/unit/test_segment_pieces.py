"""A segment is read in pieces, as an appended file is, and never past ``MAX_SEGMENT_BYTES`` (issue 37, item 3).

Before, ``StreamTail`` read each segment whole into one list of events
(a 104 MB segment took 440 MB to list), a follower's thread did the same,
and nothing bounded a segment's size on read. Now a bounded read takes a
piece of the segment being read, a store that stops answering mid-segment
is read on from where it stopped (each event once), the reading thread
holds one piece until the poll takes it, and a segment over the cap is read
up to it and named, with its size and the cap, in the run's problems.
"""

from __future__ import annotations

import io

import pytest

from jobs.events import Metric, dumps
from tests.memory_run_files import DEADLINE_SECONDS, MemoryFiles, TrackedBytes
from tpudash.runs import segments
from tpudash.runs.backends import LocalRunFiles
from tpudash.runs.segments import StreamTail
from tpudash.runs.store import RunStore
from tpudash.runs.tail import LineTail

PIECE = 64 << 10


def steps(events) -> list[int | None]:
    return [getattr(event, "step", None) for _, event in events]


def segment_bytes(first: int, last: int) -> bytes:
    return "".join(
        dumps(Metric("loss", 1.0, step=step), float(step)) + "\n" for step in range(first, last + 1)
    ).encode()


@pytest.fixture
def files() -> MemoryFiles:
    return MemoryFiles()


def test_a_bounded_read_takes_a_large_segment_a_piece_at_a_time_each_event_once(files):
    files.objects["events/w-00000001.jsonl"] = segment_bytes(1, 5_000)  # about 400 KB
    files.objects["events/w-00000002.jsonl"] = segment_bytes(5_001, 5_001)
    tail = StreamTail(files, appends=False)

    pieces = []
    while True:
        pieces.append(steps(tail.read_new(max_bytes=PIECE)))
        if tail.at_end:
            break

    assert [step for piece in pieces for step in piece] == list(range(1, 5_002))
    assert len(pieces) > 5 and max(len(piece) for piece in pieces) < 1_000  # pieces, not the whole segment
    assert tail.segments_read == 2 and tail.report() == []


class FailingOnce(TrackedBytes):
    """A segment's handle whose second read fails once, as a store's ranged request that times out."""

    reads = 0

    def read(self, size: int | None = -1, /) -> bytes:
        FailingOnce.reads += 1
        if FailingOnce.reads == 2:
            raise ConnectionError("reset by peer")
        return super().read(size)


def test_a_store_that_stops_answering_mid_segment_is_read_on_from_where_it_stopped(files):
    data = segment_bytes(1, 3_000)
    files.objects["events/w-00000001.jsonl"] = data
    tail = StreamTail(files, appends=False)
    opened = files.open

    def open_failing_once(name: str) -> io.BytesIO:
        if name.startswith("events/"):
            files.opened[name] = files.opened.get(name, 0) + 1
            handle = FailingOnce(data)
            files.handles.append(handle)
            return handle
        return opened(name)

    files.open = open_failing_once  # type: ignore[method-assign]
    first = steps(tail.read_new(max_bytes=PIECE))
    assert first and not tail.at_end
    assert tail.read_new(max_bytes=PIECE) == [] and tail.unreachable == "ConnectionError: reset by peer"
    rest = []
    while not tail.at_end:
        rest += steps(tail.read_new(max_bytes=PIECE))

    assert first + rest == list(range(1, 3_001))  # each event once, in order
    assert files.opened["events/w-00000001.jsonl"] == 1 and tail.report() == []
    tail.close()
    assert all(handle.closed for handle in files.handles)


def test_a_followers_thread_holds_one_piece_until_the_poll_takes_it(files):
    files.objects["events/w-00000001.jsonl"] = segment_bytes(1, 40_000)  # over 3 MiB: several pieces
    tail = StreamTail(files, appends=False, prefetch=True)

    files.listings_open.clear()  # the thread's first listing waits until the first poll has returned
    assert tail.read_new() == []  # the thread starts
    files.listings_open.set()
    assert tail.news.wait(DEADLINE_SECONDS)
    tail.news.clear()
    taken = steps(tail.read_new())
    assert 0 < len(taken) < 40_000  # one piece waited for the poll; before, the whole segment did
    while len(taken) < 40_000:
        assert tail.news.wait(DEADLINE_SECONDS)
        tail.news.clear()  # before taking: news of a piece read after this take is not lost
        taken += steps(tail.read_new())
    assert taken == list(range(1, 40_001))
    tail.close()


# The cap.


def local_run(tmp_path, data: bytes):
    run_dir = tmp_path / "run"
    (run_dir / "events").mkdir(parents=True)
    (run_dir / "events" / "w-00000001.jsonl").write_bytes(data)
    (run_dir / "events" / "w-00000002.jsonl").write_bytes(segment_bytes(9_999, 9_999))
    return LocalRunFiles(run_dir)


def test_a_segment_over_the_cap_is_read_up_to_it_and_named_with_its_size_and_the_cap(tmp_path):
    data = segment_bytes(1, 2_000)  # about 160 KB
    tail = StreamTail(local_run(tmp_path, data), appends=False, max_segment_bytes=PIECE)

    read = steps(tail.read_all())

    whole_lines = data[:PIECE].count(b"\n")
    assert read == [*range(1, whole_lines + 1), 9_999]  # the line the cap cut is not read, the next segment is
    size = f"{len(data) / 1024:.1f} KiB"
    assert tail.report() == [
        f"events/w-00000001.jsonl: {size}, more than a segment may hold (64 KiB); its first 64 KiB read, the rest never"
    ]


def test_a_segment_exactly_at_the_cap_is_read_whole_without_a_word(tmp_path):
    data = segment_bytes(1, 2_000)
    tail = StreamTail(local_run(tmp_path, data), appends=False, max_segment_bytes=len(data))
    assert steps(tail.read_all()) == [*range(1, 2_001), 9_999]
    assert tail.report() == []


def test_over_the_cap_in_a_store_that_cannot_tell_the_size_the_line_names_the_cap(files):
    files.objects["events/w-00000001.jsonl"] = segment_bytes(1, 2_000)
    tail = StreamTail(files, appends=False, max_segment_bytes=PIECE)
    list(tail.read_all())
    assert tail.report() == [
        "events/w-00000001.jsonl: more than a segment may hold (64 KiB); its first 64 KiB read, the rest never"
    ]


def test_a_listed_run_with_a_segment_over_the_cap_says_so_among_its_problems(tmp_path, monkeypatch):
    monkeypatch.setattr(segments, "MAX_SEGMENT_BYTES", PIECE)
    store = RunStore(tmp_path / "runs")
    run_dir = store.root / "20261125-000000-train-abcdef"
    (run_dir / "events").mkdir(parents=True)  # no run.json: the listing reads the run from its events
    (run_dir / "events" / "w-00000001.jsonl").write_bytes(segment_bytes(1, 2_000))

    (info,) = store.list_runs()

    assert any(
        problem.startswith("events/w-00000001.jsonl: ") and "more than a segment may hold (64 KiB)" in problem
        for problem in info.problems
    ), info.problems
    assert info.final_metrics["loss"] == 1.0


def test_lines_read_before_a_failing_read_are_returned_and_the_next_call_reads_on(tmp_path):
    data = b"".join(b"line %d\n" % number for number in range(1, 11))
    handle = FailingOnce(data)
    FailingOnce.reads = 0
    lines = LineTail(tmp_path / "events.jsonl", chunk_bytes=16, opener=lambda: handle)

    first = lines.read_lines()  # its second read fails: what the first one completed is the caller's
    assert first == [b"line 1", b"line 2"] and not lines.at_end
    rest = lines.read_lines()
    assert first + rest == [b"line %d" % number for number in range(1, 11)] and lines.at_end
