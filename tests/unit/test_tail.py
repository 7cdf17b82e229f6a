"""Reading a file as it grows: whole lines only, a missing file is nothing yet, a writer's last words at the end."""

from __future__ import annotations

import pytest

from jobs.events import Metric, RunFinished, dumps
from tpudash.runs.tail import EventTail, LineTail


def test_lines_come_once_each_and_only_when_their_newline_is_written(tmp_path):
    path = tmp_path / "growing.log"
    tail = LineTail(path)
    assert tail.read_lines() == []  # not created yet
    path.write_bytes(b"first\nsec")
    assert tail.read_lines() == [b"first"]
    assert tail.read_lines() == []
    with open(path, "ab") as handle:
        handle.write(b"ond\nthird")
    assert tail.read_lines() == [b"second"]
    assert tail.read_lines(final=True) == [b"third"]  # the writer is gone: its half line counts
    tail.close()


def test_a_final_read_of_a_missing_file_raises_a_limit_caps_each_read_and_a_long_line_is_skipped(tmp_path):
    with pytest.raises(OSError):
        LineTail(tmp_path / "missing").read_lines(final=True)
    path = tmp_path / "long.log"
    path.write_bytes(b"a" * 10 + b"\nbb\n")
    tail = LineTail(path, limit=4, max_line_bytes=8)
    # Each call reads at most 4 bytes; the 10-byte line passes the 8-byte cap and is dropped, not buffered.
    assert tail.read_lines() == []
    assert tail.read_lines() == []
    assert tail.read_lines() == [] and tail.long_lines == [1]
    assert tail.read_lines() == [b"bb"]
    tail.close()


def test_an_event_tail_parses_lines_names_bad_ones_and_notices_the_finish(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(dumps(Metric("loss", 0.5, step=0), 1.0) + "\nnot json\n" + dumps(RunFinished("done", {}), 2.0))
    tail = EventTail(path)
    assert [(stamp, type(event).__name__) for stamp, event in tail.read_new()] == [(1.0, "Metric")]
    assert tail.problems == ["events.jsonl line 2: truncated or not JSON"] and not tail.finished
    assert [stamp for stamp, _ in tail.read_new(final=True)] == [2.0]
    assert tail.finished
    tail.close()
