"""Issue 25's choice of tool: events.jsonl read by msgspec (tpudash's reader) beside plain json + checks.

A 100,000-event file as a training run writes it (metrics, progress, a log
line now and then) is read line by line both ways: ``decode_event_line``
(msgspec decodes into typed Structs with ``jobs.events``'s ranges, then the
event dataclass is built) and the plain-code alternative measured before the
choice was made: ``json.loads`` and the same type and range checks written
as Python, field by field. The ratio is plain / msgspec.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from typing import Any

from tests.benchmarks.harness import Result

EVENTS = 100_000


def make_lines(count: int) -> list[bytes]:
    from jobs.events import Log, Metric, Progress, dumps

    lines = []
    for index in range(count):
        if index % 100 == 99:
            event = Log("info", f"epoch {index // 100} done")
        elif index % 10 == 9:
            event = Progress(index, count, "step")
        else:
            event = Metric("loss", 1.0 / (index + 1), index, epoch=index // 100)
        lines.append(dumps(event, 1_700_000_000.0 + index).encode())
    return lines


def plain_reader():
    """json.loads, then each field checked in Python from the dataclass annotations (the alternative)."""
    from jobs import events

    def allowed(name: str, hint: str, value: Any) -> bool:
        if value is None and hint.endswith("| None"):
            return True
        base = hint.removesuffix(" | None")
        if base == "str":
            limit = events.MAX_TEXT_CHARS if name in events.TEXT_FIELDS else events.MAX_NAME_CHARS
            return isinstance(value, str) and len(value) <= limit
        if base == "int":
            return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < events.MAX_COUNT
        if base == "float":
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        return isinstance(value, dict if base == "dict" else list) and events.json_size(value) <= events.MAX_NODES

    fields = {
        kind: [(item.name, str(item.type)) for item in dataclasses.fields(cls)]
        for kind, cls in events.EVENT_TYPES.items()
    }

    def parse(line: bytes) -> tuple[float | None, Any]:
        payload = json.loads(line)
        cls = events.EVENT_TYPES[payload["type"]]
        values = {}
        for name, hint in fields[cls.type]:
            if name in payload:
                if not allowed(name, hint, payload[name]):
                    raise ValueError(f"{cls.type} event: {name}")
                values[name] = payload[name]
        stamp = payload.get("t")
        if stamp is not None and not events.is_sane_timestamp(stamp):
            raise ValueError("t")
        return stamp, cls(**values)

    return parse


def time_reader(parse, lines: list[bytes]) -> float:
    started = time.perf_counter()
    for line in lines:
        parse(line)
    return time.perf_counter() - started


def run(quick: bool) -> list[Result]:
    from jobs.events import decode_event_line

    lines = make_lines(2_000 if quick else EVENTS)
    plain_parse = plain_reader()
    assert plain_parse(lines[5]) == decode_event_line(lines[5])  # the two read the same event
    plain, typed = [], []
    for _ in range(1 if quick else 5):  # alternated: background load hits both alike
        plain.append(time_reader(plain_parse, lines))
        typed.append(time_reader(decode_event_line, lines))
    plain_s, typed_s = statistics.median(plain), statistics.median(typed)
    return [
        Result(
            benchmark="event_parse",
            figure=f"read + check {len(lines):,} events (tpudash: msgspec typed decoding)",
            value=round(typed_s * 1000, 1),
            unit="ms",
            baseline_name="plain json.loads + Python checks",
            baseline=round(plain_s * 1000, 1),
            ratio=round(plain_s / typed_s, 2),
            notes="ratio = plain / msgspec (how many times faster tpudash's reader is); medians of alternated rounds",
        )
    ]


if __name__ == "__main__":
    for result in run(quick=False):
        print(result)
