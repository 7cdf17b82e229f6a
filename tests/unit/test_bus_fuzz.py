"""Property tests of the run-data boundary: whatever a file holds, reading it never raises past the reader.

Generated: arbitrary JSON objects and bytes as event lines, arbitrary JSON
values in every run.json field, and arbitrary byte splits of a growing
events.jsonl. The example count comes from the Hypothesis profile
(tests/conftest.py: small by default, larger in CI).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from jobs.events import EVENT_TYPES, Metric, Progress, RunFinished, Table, decode_event_line, dumps
from tpudash.format import format_timestamp
from tpudash.runs.store import RunStore
from tpudash.runs.tail import EventTail

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELD_NAMES = sorted({"t", "name", "value", "step", "columns", "rows", "level", "values", "devices"})
event_objects = st.fixed_dictionaries(
    {"type": st.sampled_from(sorted(EVENT_TYPES)) | json_values},
    optional={name: json_values for name in FIELD_NAMES},
)
RUN_FIELDS = ("job", "status", "started", "finished", "params", "summary", "final_metrics", "error", "source", "pid")


@given(event_objects)
def test_any_json_object_is_an_event_or_a_named_refusal(payload):
    try:
        stamp, event = decode_event_line(json.dumps(payload))
    except ValueError as error:
        assert str(error)
        return
    assert stamp is None or format_timestamp(stamp) != "?"
    assert event.type == payload["type"]


@given(st.binary(max_size=200))
def test_any_bytes_are_an_event_or_a_named_refusal(line):
    try:
        decode_event_line(line)
    except ValueError as error:
        assert str(error)


@given(st.fixed_dictionaries({}, optional={name: json_values for name in RUN_FIELDS}))
def test_any_run_json_lists_and_formats(record):
    with tempfile.TemporaryDirectory() as root:
        run_dir = Path(root) / "20260101-000000-train-abcdef"
        run_dir.mkdir()
        (run_dir / "run.json").write_text(json.dumps(record))
        [info] = RunStore(Path(root)).list_runs()
        format_timestamp(info.started), info.duration, info.to_dict()
        assert info.pid is None or 1 <= info.pid <= 2**22


EVENTS = [
    (1.0, Metric("loss", 0.5, 0)),
    (2.0, Progress(1, 2, "epoch")),
    (3.0, Table("check", ["device", "ms"], [["cpu:0", 1.5]])),
    (4.0, RunFinished("done", {"loss": 0.25})),
]
CONTENT = "".join(dumps(event, stamp) + "\n" for stamp, event in EVENTS).encode()


@given(st.lists(st.integers(min_value=0, max_value=len(CONTENT)), max_size=10))
def test_any_byte_splits_give_the_events_of_one_read(cuts):
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "events.jsonl"
        path.write_bytes(b"")
        tail = EventTail(path)
        read = []
        for start, end in zip([0, *sorted(cuts)], [*sorted(cuts), len(CONTENT)]):
            with open(path, "ab") as handle:
                handle.write(CONTENT[start:end])
            read += tail.read_new()
        tail.close()
        assert read == EVENTS and tail.problems == []
