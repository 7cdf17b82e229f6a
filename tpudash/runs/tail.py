"""Reading files that grow: whole lines as a writer appends them, and a run's events from those lines.

``LineTail`` is the one reader of a growing file: each ``read_lines`` returns
the lines completed since the last, never half a line a writer is still
writing. It opens only regular files (``layout.open_regular``), reads in
bounded chunks, skips (and counts) a line longer than its cap rather than
buffering it, and given a cap on the file (a segment's) reads no further. ``EventTail`` parses those lines of events.jsonl or
telemetry.jsonl into ``jobs.events`` events, every field checked, naming
what it could not read; ``read_events`` reads a whole file that way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path, PurePath
from typing import BinaryIO, Protocol

from jobs.events import Event, RunFinished, decode_event_line
from tpudash.runs.layout import RefusedFile, open_regular, size_words

MAX_PROBLEMS_KEPT = 100
MAX_LINE_BYTES = 1 << 20
"""A line of events.jsonl longer than this is skipped (an event is a few hundred bytes; a table a few KiB)."""
READ_CHUNK_BYTES = 1 << 20
"""Bytes one ``read`` call asks for: memory is bounded by this, not by the file."""


class LineTail:
    """Follows a file as a writer appends to it: each ``read_lines`` returns the lines completed since the last.

    A line is returned only once its newline is written (the writer may be
    mid-line), unless ``final`` says the writer is gone. A line longer than
    ``max_line_bytes`` is dropped as it streams in and its number kept in
    ``long_lines``. ``limit`` caps the bytes one call consumes (None: up to
    the end of the file, in chunks). ``max_file_bytes`` caps the bytes read
    from the file in all: the file ends there for this reader (a line cut by
    the cap is dropped), and ``over_cap`` says whether it held more. A
    missing file reads as nothing yet; a file ``open_regular`` refuses reads
    as nothing, its reason in ``refused``. A read that fails after some lines
    were read returns those lines; the next call meets the failure again.
    """

    def __init__(
        self,
        path: PurePath,
        limit: int | None = None,
        max_line_bytes: int = MAX_LINE_BYTES,
        chunk_bytes: int = READ_CHUNK_BYTES,
        opener: Callable[[], BinaryIO] | None = None,
        max_file_bytes: int | None = None,
    ) -> None:
        self.path = path if isinstance(path, PurePath) else Path(path)
        self.opener = opener or (lambda: open_regular(Path(self.path)))
        """Opens the file: ``open_regular`` on a local path, or a run's ``RunFiles.open`` (an object in a store)."""
        self.limit = limit
        self.max_line_bytes = max_line_bytes
        self.chunk_bytes = chunk_bytes
        self.max_file_bytes = max_file_bytes
        self.bytes_read = 0
        """Bytes taken from the file so far."""
        self.over_cap = False
        """The file holds more than ``max_file_bytes``: what is past the cap is never read."""
        self.refused: str | None = None
        """Why the file is not read (a FIFO, a symbolic link), once found; then it is not tried again."""
        self.long_lines: list[int] = []
        """Numbers (from 1) of the lines skipped for their length, not yet taken by the caller."""
        self.line_number = 0
        """Lines completed so far, skipped ones included."""
        self.at_end = False
        """Whether the last read reached the end of the file (a ``max_bytes`` may stop it sooner)."""
        self._handle: BinaryIO | None = None
        self._partial = bytearray()
        self._skipping = False

    def read_lines(self, final: bool = False) -> list[bytes]:
        """The lines completed since the last call, without their newlines."""
        return [line for _, line in self.read_numbered(final)]

    def read_numbered(self, final: bool = False, max_bytes: int | None = None) -> list[tuple[int, bytes]]:
        """The lines completed since the last call as (line number from 1, line without its newline).

        ``final``: also a last line without its newline, once the end of the
        file is reached. ``max_bytes`` (and ``limit``) stop the call after
        about that many bytes; ``at_end`` says whether it reached the end of
        the file. Raises OSError only when ``final`` and the file cannot be
        opened (RefusedFile when it is not a regular file).
        """
        if self._handle is None and not self._open(final):
            self.at_end = True  # nothing to read yet (or ever: a refused file)
            return []
        assert self._handle is not None
        lines: list[tuple[int, bytes]] = []
        budgets = [budget for budget in (self.limit, max_bytes) if budget is not None]
        budget = min(budgets) if budgets else None
        self.at_end = False
        while budget is None or budget > 0:
            wanted = self.chunk_bytes if budget is None else min(self.chunk_bytes, budget)
            try:
                chunk = self._read_chunk(wanted)
            except Exception:
                if lines:
                    break  # a store that stopped answering mid-way: these lines are the caller's, the error the next's
                raise
            if not chunk:
                self.at_end = True
                break
            if budget is not None:
                budget -= len(chunk)
            self._split(chunk, lines)
        if final and self.at_end and (self._partial or self._skipping):
            if self.over_cap:
                self._partial.clear()  # cut by the cap, not by its writer: the cap's own line says so
                self._skipping = False
            else:
                self._end_line(lines)
        return lines

    def _read_chunk(self, wanted: int) -> bytes:
        """Up to ``wanted`` bytes more of the file; b"" at its end, or at the cap (``over_cap``: there is more)."""
        assert self._handle is not None
        if self.max_file_bytes is not None:
            room = self.max_file_bytes - self.bytes_read
            if room <= 0:
                # One byte past the cap says whether the file ends there or goes on unread.
                if not self.over_cap:
                    self.over_cap = bool(self._handle.read(1))
                return b""
            wanted = min(wanted, room)
        chunk = self._handle.read(wanted)
        self.bytes_read += len(chunk)
        return chunk

    def _open(self, final: bool) -> bool:
        if self.refused is not None:
            if final:
                raise RefusedFile(self.refused)
            return False
        try:
            self._handle = self.opener()
        except RefusedFile as error:
            self.refused = str(error)
            if final:
                raise
            return False
        except OSError:
            if final:
                raise
            return False
        return True

    def _split(self, chunk: bytes, lines: list[tuple[int, bytes]]) -> None:
        pieces = chunk.split(b"\n")
        rest = pieces.pop()  # after the chunk's last newline: the start of a line still being written
        if pieces:
            self._keep(pieces[0])  # completes the line begun in an earlier chunk
            self._end_line(lines)
            for piece in pieces[1:]:  # whole lines within this chunk
                self.line_number += 1
                if len(piece) > self.max_line_bytes:
                    self.long_lines.append(self.line_number)
                else:
                    lines.append((self.line_number, piece))
        self._keep(rest)

    def _keep(self, piece: bytes) -> None:
        """Add to the line being read, unless it is being skipped or ``piece`` takes it past the cap."""
        if self._skipping or not piece:
            return
        if len(self._partial) + len(piece) > self.max_line_bytes:
            self._skipping = True
            self._partial.clear()
        else:
            self._partial += piece

    def _end_line(self, lines: list[tuple[int, bytes]]) -> None:
        self.line_number += 1
        if self._skipping:
            self.long_lines.append(self.line_number)
            self._skipping = False
        else:
            lines.append((self.line_number, bytes(self._partial)))
        self._partial.clear()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class EventSource(Protocol):
    """What a run's events are read from: an ``EventTail`` (one file) or a ``segments.StreamTail`` (both layouts)."""

    @property
    def path(self) -> PurePath: ...

    def read_all(self) -> Iterator[tuple[float | None, Event]]: ...

    def report(self) -> list[str]: ...

    def close(self) -> None: ...


def fold_events(source: EventSource | Path, visit: Callable[[float | None, Event], None]) -> list[str]:
    """Hand each event of ``source`` (a source, or a local file) to ``visit`` as it is read; what could not be read.

    Memory is bounded by a chunk, not by the file: a run of a million events
    is folded (its final metrics, its last time) without holding its events.
    """
    if isinstance(source, Path):
        source = EventTail(source)
    try:
        for stamp, event in source.read_all():
            visit(stamp, event)
    except RefusedFile as error:
        return [str(error)]
    except OSError as error:
        return [f"{source.path.name}: cannot read ({error.strerror or error})"]
    finally:
        source.close()
    return source.report()


def read_events(source: EventSource | Path) -> tuple[list[tuple[float | None, Event]], list[str]]:
    """Every event that parses, with its timestamp, plus what could not be read (``EventTail.report``)."""
    events: list[tuple[float | None, Event]] = []
    problems = fold_events(source, lambda stamp, event: events.append((stamp, event)))
    return events, problems


class EventTail:
    """Follows a run's events.jsonl as its writer appends: each ``read_new`` returns the events added since.

    Lines come from a ``LineTail``; a line that does not parse (not JSON, a
    field of the wrong type or range, longer than the line cap) is skipped,
    counted in ``problem_count`` and named in ``problems`` (the first
    hundred); ``report`` says it as a user reads it. ``max_file_bytes``: see
    ``LineTail`` (its reader names a file over it). A missing file reads
    as no events yet (the engine has not started the run); a file that is
    not a regular one is never read, and named.
    """

    def __init__(
        self, path: PurePath, opener: Callable[[], BinaryIO] | None = None, max_file_bytes: int | None = None
    ) -> None:
        self.lines = LineTail(path, opener=opener, max_file_bytes=max_file_bytes)
        self.problems: list[str] = []
        self.problem_count = 0
        self.finished = False
        """True once a RunFinished was read: nothing more will come."""

    @property
    def path(self) -> PurePath:
        return self.lines.path

    def read_all(self) -> Iterator[tuple[float | None, Event]]:
        """Every event from here to the end of the file (a last line without its newline too), read in chunks.

        Memory is bounded by a chunk whatever the file's size: a caller that
        folds the events as they come (a run's final metrics) never holds them all.
        """
        while True:
            yield from self.read_new(final=True, max_bytes=READ_CHUNK_BYTES)
            if self.at_end:
                return

    @property
    def at_end(self) -> bool:
        """Whether the last read reached the end of the file."""
        return self.lines.at_end

    def read_new(self, final: bool = False, max_bytes: int | None = None) -> list[tuple[float | None, Event]]:
        """The events completed since the last call; ``final``: also a last line without its newline.

        ``max_bytes``: read about that much at most (``at_end`` says whether
        the file's end was reached), so a long run is read in bounded pieces.
        Raises OSError only when ``final`` and the file exists but cannot be read.
        """
        refused_before = self.lines.refused
        try:
            numbered = self.lines.read_numbered(final, max_bytes)
        finally:
            if self.lines.refused is not None and refused_before is None:
                self.note_problem(self.lines.refused)
        events: list[tuple[float | None, Event]] = []
        for number, line in numbered:
            while self.lines.long_lines and self.lines.long_lines[0] < number:
                self._long_line(self.lines.long_lines.pop(0))
            if not line.strip():
                continue
            try:
                stamp, event = decode_event_line(line)
            except ValueError as error:
                self.note_problem(f"{self.path.name} line {number}: {error}")
                continue
            events.append((stamp, event))
            if isinstance(event, RunFinished):
                self.finished = True
        while self.lines.long_lines:
            self._long_line(self.lines.long_lines.pop(0))
        return events

    def _long_line(self, number: int) -> None:
        self.note_problem(f"{self.path.name} line {number}: longer than {size_words(self.lines.max_line_bytes)}")

    def note_problem(self, text: str) -> None:
        """Count a line (or a file) that could not be read, and keep its reason among the first hundred."""
        self.problem_count += 1
        if len(self.problems) < MAX_PROBLEMS_KEPT:
            self.problems.append(text)

    def report(self) -> list[str]:
        """What could not be read, as a run shows it: ``N events could not be read: <the first reason>``."""
        if not self.problem_count:
            return []
        if self.lines.refused is not None and self.problem_count == 1:
            return [self.lines.refused]
        count = self.problem_count
        return [f"{count} event{'' if count == 1 else 's'} could not be read: {self.problems[0]}"]

    def close(self) -> None:
        self.lines.close()
