"""A run's stream of events (or telemetry) in either layout: one appended file, or immutable segments.

A local writer appends to ``events.jsonl``. An object store has no append,
so a writer there puts its events in segments it never touches again,
``events/<writer>-<seq>.jsonl`` (``segment_listing`` says how they are
named, listed and ordered). A run may have both (a local run copied into a
bucket keeps its ``events.jsonl``).

``StreamTail`` reads both, a piece at a time whatever the layout: the
appended file first (``appended.AppendedStream``), then each listed
segment in the order ``segment_listing.SegmentListing`` gives, in pieces of
at most the caller's ``max_bytes``, so a run held in one large segment
opens in the memory of a piece, as an appended file does. A segment is at
most ``MAX_SEGMENT_BYTES``: a reader never reads one past that, and the
run's problems name the file, its size and the cap. A follower of a run in
a store reads on a thread of its own (``prefetch.Prefetcher``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import PurePosixPath
from threading import Event as Flag
from threading import Thread

from jobs.events import Event, RunFinished
from tpudash.runs.appended import AppendedStream
from tpudash.runs.backends import RunFiles
from tpudash.runs.layout import EVENTS_STREAM, RefusedFile, size_words
from tpudash.runs.prefetch import Prefetcher
from tpudash.runs.segment_listing import LIST_SECONDS, MAX_ORDER_PROBLEMS, SegmentListing
from tpudash.runs.segment_listing import MAX_LIST_SECONDS as MAX_LIST_SECONDS
from tpudash.runs.segment_listing import SEGMENT_PATTERN as SEGMENT_PATTERN
from tpudash.runs.segment_listing import new_writer_id as new_writer_id
from tpudash.runs.segment_listing import parse_segment_name as parse_segment_name
from tpudash.runs.segment_listing import segment_name as segment_name
from tpudash.runs.segment_listing import segment_order as segment_order
from tpudash.runs.tail import MAX_PROBLEMS_KEPT, READ_CHUNK_BYTES, EventTail

MAX_SEGMENT_BYTES = 1 << 30
"""The most a segment may hold; a reader reads no further and names a larger one in the run's problems.

Writers close a segment at ``segment_writer.SEGMENT_BYTES`` (256 KiB, looked at
every quarter second) or every ``SEAL_SECONDS``, so theirs hold a few MiB at
most even from a loop that records as fast as it can; a GiB is the most a
writer reads back of its own spilled segment and what ``tpudash copy``
copies (``transfer.MAX_COPY_FILE_BYTES``). A segment is read in pieces, so
the cap bounds the time a reader spends on one object, not its memory."""


class StreamTail:
    """A run's ``events`` (or ``telemetry``) in both layouts, read as they grow; see the module docstring.

    Behaves as an ``EventTail``: ``read_new``, ``read_all``, ``at_end``,
    ``finished``, ``report`` and ``close``.
    """

    def __init__(
        self,
        files: RunFiles,
        stream: str = EVENTS_STREAM,
        *,
        appends: bool = True,
        prefetch: bool = False,
        list_every: float = LIST_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        max_segment_bytes: int | None = None,
    ) -> None:
        self.files = files
        self.stream = stream
        self.prefetch = prefetch
        """Read on a thread of its own (a follower of a run in a store): ``read_new`` then never waits for the network."""
        self.max_segment_bytes = max_segment_bytes or MAX_SEGMENT_BYTES
        """The most of a segment read (``MAX_SEGMENT_BYTES`` unless a test says less)."""
        self._clock = clock
        self.appended = AppendedStream(files, stream, appends=appends)
        self.listing = SegmentListing(files, stream, list_every=list_every, clock=clock)
        self._prefetch = Prefetcher(self._read_piece, self._until_next_listing, f"tpudash-follow-{files.where}")
        self._leftover: list[tuple[float | None, Event]] = []
        """What the reading thread read and no one took when it was stopped: the next read's first events."""
        self._reading: tuple[str, int, EventTail] | None = None
        """The segment being read, (writer, sequence number, its reader), until its end."""
        self._segment_tails: list[EventTail] = []
        """Segments read that had problems: their reasons go into ``report``."""
        self._over_cap: list[str] = []
        self._over_cap_count = 0
        self.segments_read = 0
        self.finished = False
        """True once a RunFinished was read: nothing more will come."""
        self.at_end = False
        self._read_at_end = False  # pragma: no mutate - set by every read before it is looked at
        self._read_finished = False
        self.unreachable: str | None = None
        """Why the last request failed (the store is unreachable), or None once a listing succeeds."""

    @property
    def path(self) -> PurePosixPath:
        return PurePosixPath(self.stream)

    @property
    def appends(self) -> bool:
        """Whether a writer may still append to ``<stream>.jsonl`` (a local run); in a store that file is complete."""
        return self.appended.appends

    @property
    def listings(self) -> int:
        """How many times the segments were listed: a store's requests, for the benchmark."""
        return self.listing.listings

    @property
    def news(self) -> Flag:
        """Set when the reading thread has read new events (``prefetch``); whoever takes them may clear it."""
        return self._prefetch.news

    @property
    def _prefetcher(self) -> Thread | None:
        """The reading thread, while there is one (the tests look at it)."""
        return self._prefetch.thread

    def read_all(self) -> Iterator[tuple[float | None, Event]]:
        """Everything written so far, in bounded pieces (see ``EventTail.read_all``)."""
        while True:
            yield from self.read_new(final=True, max_bytes=READ_CHUNK_BYTES)
            if self.at_end:
                return

    def read_new(self, final: bool = False, max_bytes: int | None = None) -> list[tuple[float | None, Event]]:
        """The events completed since the last call, from the appended file and then from the segments.

        ``final``: the writer is gone (read a last line without its newline,
        and list the segments now, whatever the schedule). ``max_bytes``: read
        about that much at most (``at_end`` says whether all was read), at most
        one segment a call. With ``prefetch``, a call that is not final hands
        over what the reading thread has read since, at once; a final one
        stops that thread and reads the rest here.
        """
        if self.prefetch and not final:
            events, self.at_end = self._prefetch.take()
            self.finished = self.finished or any(isinstance(event, RunFinished) for _, event in events)
            return events
        self._leftover += self._prefetch.stop()  # taken here, so nothing is read twice
        events = self._read(final, max_bytes)
        self.at_end, self.finished = self._read_at_end, self._read_finished
        return events

    @contextmanager
    def here(self) -> Iterator[None]:
        """Read on the caller's thread meanwhile, whatever ``prefetch`` says (a worker catching up on a run)."""
        prefetch, self.prefetch = self.prefetch, False
        try:
            yield
        finally:
            self.prefetch = prefetch

    def _read_piece(self, max_bytes: int) -> tuple[list[tuple[float | None, Event]], bool]:
        """The reading thread's read: a piece, and whether it reached the end of what is there."""
        events = self._read(final=False, max_bytes=max_bytes)
        return events, self._read_at_end

    def _until_next_listing(self) -> float:
        return self.listing.next_listing - self._clock()

    def _read(self, final: bool, max_bytes: int | None) -> list[tuple[float | None, Event]]:
        events, self._leftover = self._leftover, []
        if not self.appended.done:
            events += self.appended.read_new(final, max_bytes)
            self.unreachable = self.appended.unreachable or self.unreachable
        if self.listing.due(final):
            self.unreachable = self.listing.refresh()
        if self.appended.at_end:  # the appended file's events come first
            while True:
                if self._reading is None:
                    due = self.listing.next_segment(final)
                    if due is None:
                        break
                    self._reading = self._open_segment(*due)
                piece = self._read_segment(max_bytes)
                if piece is None:
                    break  # the store did not answer: the segment is read on from here at the next call
                events += piece
                if max_bytes is not None:
                    break  # one piece a call when reading in bounded pieces
        # Kept apart from ``at_end`` and ``finished``: with prefetching, those say what the caller has taken.
        # At the end: nothing more can be read now (segments held behind a gap wait for a later call).
        self._read_at_end = self.appended.at_end and self._reading is None and self.listing.next_segment(final) is None
        self._read_finished = self._read_finished or self.appended.finished
        return events

    def _open_segment(self, writer: str, seq: int) -> tuple[str, int, EventTail]:
        relative = self.listing.name(writer, seq)
        opener = lambda: self.files.open(relative)  # noqa: E731 - bound to this segment's name
        return writer, seq, EventTail(PurePosixPath(relative), opener=opener, max_file_bytes=self.max_segment_bytes)

    def _read_segment(self, max_bytes: int | None) -> list[tuple[float | None, Event]] | None:
        """The next piece of the segment being read (to its end when ``max_bytes`` is None), or None when the
        store failed to answer; at the segment's end, the next one is due."""
        assert self._reading is not None
        writer, seq, tail = self._reading
        events: list[tuple[float | None, Event]] = []
        try:
            while True:  # a segment is complete: each read is final, in pieces of at most a chunk
                events += tail.read_new(final=True, max_bytes=min(max_bytes or READ_CHUNK_BYTES, READ_CHUNK_BYTES))
                if tail.at_end or max_bytes is not None:
                    break
        except FileNotFoundError:
            self._done_with_segment(found=False)  # listed, then removed (a spill directory emptied by its upload)
            return events
        except RefusedFile:
            tail.lines.at_end = True  # named in the tail's problems: never read
        except Exception as error:  # noqa: BLE001 - a store's client raises its own types when unreachable
            self.unreachable = f"{type(error).__name__}: {error}"
            return events or None  # what was read is kept; the rest is read from there at the next call
        if tail.at_end:
            self._done_with_segment(found=True)
        return events

    def _done_with_segment(self, *, found: bool) -> None:
        assert self._reading is not None
        writer, seq, tail = self._reading
        self._reading = None
        tail.close()
        self.listing.took(writer, seq)
        if not found:
            return
        self.segments_read += 1
        self._read_finished = self._read_finished or tail.finished
        if tail.problem_count:
            self._segment_tails.append(tail)
        if tail.lines.over_cap:
            self._note_over_cap(str(tail.path))

    def _note_over_cap(self, relative: str) -> None:
        self._over_cap_count += 1
        if len(self._over_cap) >= MAX_ORDER_PROBLEMS:
            return
        cap = size_words(self.max_segment_bytes)
        size = self._size_of(relative)
        held = f"{size_text(size)}, more" if size is not None else "more"
        self._over_cap.append(
            f"{relative}: {held} than a segment may hold ({cap}); its first {cap} read, the rest never"
        )

    def _size_of(self, relative: str) -> int | None:
        """A file's size from its key (``RunFiles.key``: its size comes last), or None when it cannot be told."""
        key = getattr(self.files, "key", None)
        try:
            found = key(relative) if key is not None else None
        except Exception:  # noqa: BLE001 - a store away: the line says the cap without the size
            return None
        size = found[-1] if found else None
        return size if isinstance(size, int) else None

    @property
    def segment_problems(self) -> list[str]:
        """What the listing held that a writer never leaves (``SegmentListing.problems``), and segments over the cap."""
        lines = self.listing.problems + self._over_cap
        if self._over_cap_count > len(self._over_cap):
            more = self._over_cap_count - len(self._over_cap)
            lines.append(f"{self.stream}/: {more} more segment{'' if more == 1 else 's'} over the cap")
        return lines

    @property
    def problem_count(self) -> int:
        return self.appended.problem_count + sum(tail.problem_count for tail in self._segment_tails)

    @property
    def problems(self) -> list[str]:
        kept = list(self.appended.problems)
        for tail in self._segment_tails:
            kept += tail.problems
        return kept[:MAX_PROBLEMS_KEPT]

    def report(self) -> list[str]:
        """What could not be read, as a run shows it: ``N events could not be read: <the first reason>``.

        Then ``segment_problems``: segments missing, late or over the cap, files not named as segments.
        """
        return self._events_report() + self.segment_problems

    def _events_report(self) -> list[str]:
        count = self.problem_count
        if not count:
            return []
        if count == self.appended.problem_count:
            return self.appended.report()
        return [f"{count} event{'' if count == 1 else 's'} could not be read: {self.problems[0]}"]

    def close(self) -> None:
        self._prefetch.close()  # the thread ends after its current request; nothing waits for it here
        self.appended.close()
        if self._reading is not None:
            self._reading[2].close()


def size_text(count: int) -> str:
    """``104.9 MiB``, ``1 GiB``, ``900 bytes``: a file's size as a problem line says it."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return size_words(count) if count % size == 0 else f"{count / size:.1f} {unit}"
    return f"{count} bytes"
