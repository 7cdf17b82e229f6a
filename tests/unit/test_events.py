"""The event protocol round-trips through JSON, one object per line."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from jobs.events import (
    Artifact,
    Log,
    Metric,
    Progress,
    ReplicaValues,
    RunFinished,
    RunStarted,
    Table,
    UnknownEventError,
    dumps,
    event_to_dict,
    loads,
    to_jsonable,
)

EXAMPLES = [
    RunStarted("20261121-000000-matmul-abcdef", "matmul", {"m": 8}, {"kind": "CPU"}, 1.5),
    Log("warning", "dimension 100 is not a multiple of 128"),
    Progress(3, 8, "device"),
    Progress(1, None, "step"),
    Metric("loss", 0.25, 10, epoch=1, split="val"),
    ReplicaValues("product", [[[22.0, 28.0], [49.0, 64.0]]] * 2, ["/device:CPU:0", "/device:CPU:1"]),
    Table("matmul", ["device", "pass"], [["/device:CPU:0", True]]),
    Artifact("tensorboard", "/tmp/run/tensorboard"),
    RunFinished("failed", {"steps": 3}, "ValueError: boom", "Traceback ..."),
]


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda event: event.type)
def test_every_event_round_trips_through_one_json_line(event):
    line = dumps(event, timestamp=12.5)
    assert "\n" not in line
    assert json.loads(line)["t"] == 12.5
    assert loads(line) == event


def test_numpy_values_become_plain_json():
    event = ReplicaValues("gflops", np.array([1.5, 2.5], dtype=np.float32), ["a", "b"])
    payload = event_to_dict(event)
    assert payload["values"] == [1.5, 2.5]
    assert all(type(value) is float for value in payload["values"])
    metric = event_to_dict(Metric("loss", np.float64(0.5), np.int64(3)))
    assert (metric["value"], metric["step"]) == (0.5, 3)


@pytest.mark.parametrize(
    "event",
    [
        *EXAMPLES,
        Metric("loss", float("nan"), 1),
        Metric("loss", float("-inf"), np.int64(2), epoch=np.int32(1)),
        Metric("accuracy", np.float32(0.75), 4),
        Log("info", "naïve ünïcode → escaped"),
    ],
    ids=lambda event: event.type,
)
def test_a_line_is_exactly_the_standard_json_of_the_event_and_its_plain_values(event):
    # The fast path (field names looked up once, one encoder, plain values as they are) writes what the
    # straightforward one does: every reader of events.jsonl and --json sees the same bytes as before.
    fields = {item.name: to_jsonable(getattr(event, item.name)) for item in dataclasses.fields(event)}
    expected = json.dumps({"type": event.type, "t": 12.5, **fields}, separators=(",", ":"))
    assert dumps(event, timestamp=12.5) == expected


def test_a_nan_loss_survives_the_round_trip():
    event = loads(dumps(Metric("loss", float("nan"), 1)))
    assert math.isnan(event.value)


@pytest.mark.parametrize("payload", [{"type": "telemetry"}, {"type": "metric", "name": "loss"}, [1, 2]])
def test_unknown_or_malformed_events_are_rejected_with_a_reason(payload):
    with pytest.raises(UnknownEventError):
        loads(json.dumps(payload))
