"""Reading files that grow: whole lines as a writer appends them, and a run's events from those lines.

``LineTail`` is the one reader of a growing file: each ``read_lines`` returns
the lines completed since the last, never half a line a writer is still
writing. ``EventTail`` parses those lines of events.jsonl or telemetry.jsonl
into ``jobs.events`` events, naming what it could not read; ``read_events``
reads a whole file that way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO

from jobs.events import Event, RunFinished, event_from_dict

MAX_PROBLEMS_KEPT = 100


class LineTail:
    """Follows a file as a writer appends to it: each ``read_lines`` returns the lines completed since the last.

    A line is returned only once its newline is written (the writer may be
    mid-line), unless ``final`` says the writer is gone or a line grows past
    ``limit`` bytes (a ``limit`` also caps how much one call reads). A
    missing file reads as nothing yet.
    """

    def __init__(self, path: Path, limit: int | None = None) -> None:
        self.path = Path(path)
        self.limit = limit
        self._handle: IO[bytes] | None = None
        self._partial = b""

    def read_lines(self, final: bool = False) -> list[bytes]:
        """The lines completed since the last call, without their newlines.

        ``final``: also a last line without its newline. Raises OSError only
        when ``final`` and the file cannot be opened.
        """
        if self._handle is None:
            try:
                self._handle = open(self.path, "rb")
            except OSError:
                if final:
                    raise
                return []
        chunk = self._handle.read(-1 if self.limit is None else self.limit)
        if not chunk and not (final and self._partial):
            return []
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        if (final or (self.limit is not None and len(self._partial) >= self.limit)) and self._partial:
            lines.append(self._partial)
            self._partial = b""
        return lines

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def parse_event_line(line: str | bytes) -> tuple[float | None, Event]:
    """One line of events.jsonl as (timestamp, event); ValueError names what is wrong with it."""
    try:
        payload = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("truncated or not JSON") from None
    event = event_from_dict(payload)  # UnknownEventError is a ValueError
    return payload.get("t"), event


def read_events(path: Path) -> tuple[list[tuple[float | None, Event]], list[str]]:
    """Every event that parses, with its timestamp, plus one problem per bad line."""
    tail = EventTail(path)
    try:
        events = tail.read_new(final=True)
    except OSError as error:
        return [], [f"{path.name}: cannot read ({error.strerror or error})"]
    finally:
        tail.close()
    return events, tail.problems


class EventTail:
    """Follows a run's events.jsonl as its writer appends: each ``read_new`` returns the events added since.

    Lines come from a ``LineTail``; a line that does not parse is named in
    ``problems`` (the first hundred) and skipped. A missing file reads as no
    events yet (the engine has not started the run).
    """

    def __init__(self, path: Path) -> None:
        self.lines = LineTail(path)
        self._line_number = 0
        self.problems: list[str] = []
        self.problem_count = 0
        self.finished = False
        """True once a RunFinished was read: nothing more will come."""

    @property
    def path(self) -> Path:
        return self.lines.path

    def read_new(self, final: bool = False) -> list[tuple[float | None, Event]]:
        """The events completed since the last call; ``final``: also a last line without its newline.

        Raises OSError only when ``final`` and the file exists but cannot be read.
        """
        events: list[tuple[float | None, Event]] = []
        for line in self.lines.read_lines(final):
            self._line_number += 1
            if not line.strip():
                continue
            try:
                stamp, event = parse_event_line(line)
            except ValueError as error:
                self.problem_count += 1
                if len(self.problems) < MAX_PROBLEMS_KEPT:
                    self.problems.append(f"{self.path.name} line {self._line_number}: {error}")
                continue
            events.append((stamp, event))
            if isinstance(event, RunFinished):
                self.finished = True
        return events

    def close(self) -> None:
        self.lines.close()
