"""How ``segments.StreamTail`` reads a run's stream: the appended file, the reading thread, the end, its handles.

With ``test_segment_order`` these pin the module's branches for a mutation
pass: what a follower sees before its thread has read anything, that a final
read stops the thread and takes what it read (each event once), that a
local run's half-written last line waits for its newline while a store's
appended file is read once and whole, and that every handle is closed.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from jobs.events import Metric, RunFinished, RunStarted
from tests.memory_run_files import DEADLINE_SECONDS, MemoryFiles, event_lines, segment
from tpudash.runs.backends import LocalRunFiles
from tpudash.runs.segments import StreamTail


def steps(events) -> list[int | None]:
    return [getattr(event, "step", None) for _, event in events]


@pytest.fixture
def files() -> MemoryFiles:
    return MemoryFiles()


def started(run_id: str = "20260101-000000-fit-abcdef") -> RunStarted:
    return RunStarted(run_id, "fit", {}, {}, 1.0)


# The appended file.


def test_a_local_runs_half_written_last_line_waits_for_its_newline_and_a_final_read_takes_it(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    whole = event_lines(Metric("loss", 1.0, step=1), Metric("loss", 1.0, step=2))
    (run_dir / "events.jsonl").write_bytes(whole[:-1])  # its writer is mid-line
    tail = StreamTail(LocalRunFiles(run_dir))  # a local run: its writer may still append

    assert steps(tail.read_new()) == [1]
    assert steps(tail.read_new(final=True)) == [2]


def test_a_stores_appended_file_is_complete_read_once_and_never_asked_for_again(files):
    files.objects["events.jsonl"] = event_lines(Metric("loss", 1.0, step=1), Metric("loss", 1.0, step=2))[:-1]
    tail = StreamTail(files, appends=False, clock=lambda: 0.0)

    assert steps(tail.read_new()) == [1, 2]  # no writer appends to it in a store: its last line is whole
    tail.read_new()
    tail.read_new()
    assert files.opened["events.jsonl"] == 1


def test_a_stores_appended_file_over_a_bounded_read_is_read_whole_in_pieces_then_its_segments(files):
    """A local run copied into a bucket keeps its events.jsonl: over a mebibyte, opening it hung before."""
    files.objects["events.jsonl"] = event_lines(*(Metric("loss", 1.0, step=step) for step in range(30_000)))
    segment(files, "w", 1, 30_000)
    assert len(files.objects["events.jsonl"]) > 2 << 20
    tail = StreamTail(files, appends=False)

    read = steps(tail.read_all())

    assert read == list(range(30_001))
    assert files.opened["events.jsonl"] == 1 and tail.at_end


def test_a_store_without_an_appended_file_is_asked_for_it_once(files):
    segment(files, "w", 1)
    tail = StreamTail(files, appends=False, clock=lambda: 0.0)

    assert steps(tail.read_new()) == [1]
    tail.read_new()
    assert files.opened["events.jsonl"] == 1


def test_an_appended_file_the_store_does_not_send_is_asked_for_again_and_the_tail_is_not_at_its_end(files):
    files.objects["events.jsonl"] = event_lines(Metric("loss", 1.0, step=1))
    tail = StreamTail(files, appends=False, clock=lambda: 0.0)
    files.down = True

    assert tail.read_new() == []
    assert tail.unreachable == "StoreDown: the store is unreachable" and not tail.at_end
    files.down = False
    assert steps(tail.read_new()) == [1]
    assert tail.at_end


def test_a_fresh_tail_has_read_nothing_and_is_not_at_its_end(files):
    tail = StreamTail(files, appends=False)
    assert (tail.at_end, tail.finished, tail.listings, tail.segments_read) == (False, False, 0, 0)
    assert tail.path == PurePosixPath("events")
    assert StreamTail(files, "telemetry").path == PurePosixPath("telemetry")


def test_read_all_reads_the_appended_file_a_mebibyte_at_a_time(files):
    files.objects["events.jsonl"] = event_lines(Metric("loss", 1.0, step=1))
    tail = StreamTail(files, appends=False)
    asked = []
    read_new = tail.appended.read_new

    def spy(final=False, max_bytes=None):
        asked.append(max_bytes)
        return read_new(final, max_bytes)

    tail.appended.read_new = spy  # type: ignore[method-assign]
    assert steps(tail.read_all()) == [1]
    assert asked == [1 << 20]


def test_the_finish_is_noticed_in_the_appended_file_and_in_a_segment(files, tmp_path):
    files.objects["events/w-00000001.jsonl"] = event_lines(started(), RunFinished("done", {}))
    in_a_segment = StreamTail(files, appends=False)
    list(in_a_segment.read_all())

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_bytes(event_lines(started(), RunFinished("done", {})))
    appended = StreamTail(LocalRunFiles(run_dir))
    appended.read_new()

    unfinished = MemoryFiles()
    segment(unfinished, "w", 1)
    going_on = StreamTail(unfinished, appends=False)
    list(going_on.read_all())

    assert in_a_segment.finished and appended.finished and not going_on.finished
    assert in_a_segment.segments_read == 1 and going_on.segments_read == 1 and appended.segments_read == 0


def test_a_bad_line_of_the_appended_file_is_reported_as_the_file_reports_it(files):
    files.objects["events.jsonl"] = event_lines(Metric("loss", 1.0, step=1)) + b"not json\n"
    tail = StreamTail(files, appends=False)
    list(tail.read_all())
    assert tail.report() == ["1 event could not be read: events.jsonl line 2: truncated or not JSON"]


def test_every_handle_a_tail_opens_is_closed_once_it_is_done(files):
    files.objects["events.jsonl"] = event_lines(Metric("loss", 1.0, step=0))
    for seq in (1, 2, 3):
        segment(files, "w", seq)
    tail = StreamTail(files, appends=False)
    assert steps(tail.read_all()) == [0, 1, 2, 3]
    tail.close()

    assert len(files.handles) == 4 and all(handle.closed for handle in files.handles)


# The reading thread (a follower of a run in a store).


def test_a_followers_first_poll_returns_at_once_and_is_not_at_the_end_before_its_thread_has_read(files):
    """The thread's first listing is held: the poll neither waits for it nor claims the end."""
    segment(files, "w", 1)
    files.listings_open.clear()  # the store is slow: the thread's first listing waits
    tail = StreamTail(files, appends=False, prefetch=True)

    assert tail.read_new() == [] and not tail.at_end
    files.listings_open.set()
    assert tail.news.wait(DEADLINE_SECONDS)
    assert steps(tail.read_new()) == [1]
    tail.close()


def test_a_followers_thread_reads_each_event_once_tells_of_news_and_of_the_finish(files):
    segment(files, "w", 1)
    tail = StreamTail(files, appends=False, prefetch=True, list_every=0.05)
    files.listings_open.clear()
    assert tail.read_new() == []
    files.listings_open.set()
    assert tail.news.wait(DEADLINE_SECONDS)
    tail.news.clear()
    assert steps(tail.read_new()) == [1] and not tail.finished

    files.objects["events/w-00000002.jsonl"] = event_lines(RunFinished("done", {}))
    assert tail.news.wait(DEADLINE_SECONDS)
    last = tail.read_new()
    assert [type(event).__name__ for _, event in last] == ["RunFinished"]
    assert tail.finished
    tail.close()


def test_a_follower_is_at_its_end_only_once_it_has_taken_everything(files):
    segment(files, "w", 1)
    tail = StreamTail(files, appends=False, prefetch=True)
    files.listings_open.clear()
    assert tail.read_new() == []  # the thread starts, and waits for its listing
    files.listings_open.set()
    assert tail.news.wait(DEADLINE_SECONDS)

    assert steps(tail.read_new()) == [1] and not tail.at_end  # these were the news
    assert tail.read_new() == [] and tail.at_end
    tail.close()


def test_a_final_read_stops_the_thread_and_takes_what_it_read_each_event_once(files):
    segment(files, "w", 1)
    tail = StreamTail(files, appends=False, prefetch=True)
    files.listings_open.clear()
    assert tail.read_new() == []
    thread = tail._prefetcher
    assert thread is not None and thread.daemon  # it never keeps a quitting process alive
    files.listings_open.set()
    assert tail.news.wait(DEADLINE_SECONDS)  # the thread read segment 1; no one took it yet
    segment(files, "w", 2)

    assert steps(tail.read_new(final=True)) == [1, 2]
    assert not thread.is_alive()
    assert tail.read_new(final=True) == [] and tail.at_end


def test_reading_here_bypasses_the_thread_then_the_follower_prefetches_again(files):
    segment(files, "w", 1)
    tail = StreamTail(files, appends=False, prefetch=True)

    with tail.here():
        assert steps(tail.read_new()) == [1]  # on this thread, at once
    assert tail.prefetch and tail._prefetcher is None  # no thread was started meanwhile
    tail.close()


def test_a_followers_thread_holds_a_gap_as_a_poll_does(files):
    clock = [0.0]
    segment(files, "w", 1)
    segment(files, "w", 3)
    tail = StreamTail(files, appends=False, prefetch=True, clock=lambda: clock[0])
    files.listings_open.clear()
    assert tail.read_new() == []
    files.listings_open.set()
    assert tail.news.wait(DEADLINE_SECONDS)
    assert steps(tail.read_new()) == [1]  # 3 is held: the thread's reads are not final
    tail.close()


def test_closing_a_follower_ends_its_thread(files):
    tail = StreamTail(files, appends=False, prefetch=True)
    tail.read_new()
    thread = tail._prefetcher
    assert thread is not None
    tail.close()
    thread.join(DEADLINE_SECONDS)
    assert not thread.is_alive()
