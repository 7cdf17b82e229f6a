"""A run's stream of events (or telemetry) in either layout: one appended file, or immutable segments.

A local writer appends to ``events.jsonl``. An object store has no append,
so a writer there puts its events in segments it never touches again,
``events/<writer>-<seq>.jsonl`` (``telemetry/…`` likewise): ``writer`` is
unique to one writer of one run (host, pid and a random token), ``seq``
counts from 1 with no gaps, so two writers never overwrite each other and
an upload retried after a failure writes the same object again. A run may
have both (a local run copied into a bucket keeps its ``events.jsonl``).

``StreamTail`` reads both: the appended file incrementally, then each new
segment whole, in order per writer. It lists the segments at most once a
``list_every`` seconds, and less often (doubling, up to ``MAX_LIST_SECONDS``)
while nothing new appears, so following a quiet run costs a store a few
requests a minute.

What a listing may hold that a writer never leaves is said, as the run's
problems (``report``), never skipped in silence:

- a name that is not a segment's (``-000000004.jsonl``, ``w-00000001.JSONL``,
  a sequence number 0) is never read, and counted and named; a name
  starting with "." is a writer's temporary file and is left alone;
- a gap: a writer's segment N+2 is listed while N+1 is not. A follower
  holds that writer's later segments back for ``GAP_WAIT_SECONDS`` (listing
  every ``list_every`` meanwhile) and reads them in order if the gap fills:
  a late listing is not worth a word. After that wait, or at once when the
  reading is final (the writer is gone, a finished run opened), it reads on
  and names the missing segments. Waiting for ever would stop a live run's
  view at a segment that may never come (a writer killed mid-upload); never
  waiting would read 1, 3, 2 whenever a listing lags. The wait is bounded,
  the order stays right when the gap fills within it, and the events of a
  segment that comes later still are read (nothing is dropped), named as
  read out of order.
"""

from __future__ import annotations

import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import PurePosixPath

from jobs.events import Event, RunFinished
from tpudash.runs.backends import RunFiles
from tpudash.runs.layout import EVENTS_STREAM, RefusedFile
from tpudash.runs.tail import MAX_PROBLEMS_KEPT, EventTail

LIST_SECONDS = 1.0
TICK_SECONDS = 0.1
"""How often a prefetching tail looks whether its next listing is due."""
MAX_LIST_SECONDS = 8.0
SEGMENT_PATTERN = re.compile(r"^(?P<writer>[A-Za-z0-9_.-]{1,96})-(?P<seq>[0-9]{8})\.jsonl$")
SEGMENT_RULE = "<writer>-<8 digits, from 00000001>.jsonl"
"""A segment's name, as a problem line says it."""
GAP_WAIT_SECONDS = 10.0
"""How long a follower holds a writer's segments back while an earlier one is not listed (module docstring)."""
MAX_ORDER_PROBLEMS = 20
"""Lines about missing and late segments kept for ``report``; more are counted in one line."""
MISNAMED_SHOWN = 3
"""Names of files that are not segments quoted in their one line; more are counted."""


def new_writer_id() -> str:
    """``tpu-vm-0-4242-1a2b3c``: this host, this process and a token, in characters every store allows."""
    import os

    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:48] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def segment_name(writer: str, seq: int) -> str:
    """The file name of a writer's ``seq``-th segment (from 1)."""
    return f"{writer}-{seq:08d}.jsonl"


def segment_order(name: str) -> tuple[str, int]:
    """How segments are read: by writer, then by sequence number."""
    match = SEGMENT_PATTERN.match(name)
    assert match is not None
    return match["writer"], int(match["seq"])


def parse_segment_name(name: str) -> tuple[str, int] | None:
    """A segment's (writer, sequence number), or None when ``name`` is not one a writer gives (``SEGMENT_RULE``)."""
    match = SEGMENT_PATTERN.match(name)
    if match is None or int(match["seq"]) < 1:
        return None
    return match["writer"], int(match["seq"])


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
    ) -> None:
        self.files = files
        self.prefetch = prefetch
        """Read on a thread of its own (a follower of a run in a store): ``read_new`` then never waits for the network."""
        self._prefetcher: threading.Thread | None = None
        self._prefetch_stop = threading.Event()
        self._prefetch_lock = threading.Lock()
        self._ready: list[tuple[float | None, Event]] = []
        self._leftover: list[tuple[float | None, Event]] = []
        self.news = threading.Event()
        """Set when the reading thread has read new events (``prefetch``); whoever takes them may clear it."""
        self._prefetched_at_end = False
        self.stream = stream
        self.appends = appends
        """Whether a writer may still append to ``<stream>.jsonl`` (a local run); in a store that file is complete."""
        self.list_every = list_every
        self._clock = clock
        appended_name = f"{stream}.jsonl"
        self.appended = EventTail(PurePosixPath(appended_name), opener=lambda: files.open(appended_name))
        self._appended_checked = False
        self._segment_tails: list[EventTail] = []
        """Segments read that had problems: their reasons go into ``report``."""
        self._seen: set[str] = set()
        self._waiting: dict[str, dict[int, str]] = {}
        """Segments listed and not read yet: by writer, then by sequence number, their names."""
        self._next_seq: dict[str, int] = {}
        """Each writer's next segment in order (from 1)."""
        self._gap_since: dict[str, float] = {}
        """Writers whose next segment is not listed while a later one is: since when (``clock``)."""
        self._order_problems: list[str] = []
        self._order_problem_count = 0
        self._misnamed: list[str] = []
        self._misnamed_count = 0
        self._next_listing = 0.0
        self._quiet_interval = list_every
        """How long to wait before the next listing while nothing new comes: doubles each time, up to the cap."""
        self.listings = 0
        """How many times the segments were listed: a store's requests, for the benchmark."""
        self.segments_read = 0
        self.finished = False
        """True once a RunFinished was read: nothing more will come."""
        self.at_end = False
        self._read_at_end = False  # pragma: no mutate - set by every read before it is looked at
        self._read_finished = False
        self.unreachable: str | None = None
        """Why the last listing failed (the store is unreachable), or None."""

    @property
    def path(self) -> PurePosixPath:
        return PurePosixPath(self.stream)

    def read_all(self) -> Iterator[tuple[float | None, Event]]:
        """Everything written so far, in bounded pieces (see ``EventTail.read_all``)."""
        while True:
            yield from self.read_new(final=True, max_bytes=1 << 20)
            if self.at_end:
                return

    def read_new(self, final: bool = False, max_bytes: int | None = None) -> list[tuple[float | None, Event]]:
        """The events completed since the last call, from the appended file and then from new segments.

        ``final``: the writer is gone (read a last line without its newline,
        and list the segments now, whatever the schedule). With ``prefetch``,
        a call that is not final hands over what the reading thread has read
        since, at once; a final one stops that thread and reads the rest here.
        """
        if self.prefetch and not final:
            return self._take_prefetched()
        self._stop_prefetching()
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

    def _take_prefetched(self) -> list[tuple[float | None, Event]]:
        if self._prefetcher is None:
            self._prefetcher = threading.Thread(
                target=self._prefetch_forever, name=f"tpudash-follow-{self.files.where}", daemon=True
            )
            self._prefetcher.start()
        with self._prefetch_lock:
            events, self._ready = self._ready, []
            self.at_end = self._prefetched_at_end and not events
        self.finished = self.finished or any(isinstance(event, RunFinished) for _, event in events)
        return events

    def _prefetch_forever(self) -> None:
        while not self._prefetch_stop.is_set():
            events = self._read(final=False, max_bytes=None)
            with self._prefetch_lock:
                self._ready += events
                self._prefetched_at_end = self._read_at_end
            if events:
                self.news.set()
            # Until the next listing is due (it backs off while nothing changes), or a stop.
            self._prefetch_stop.wait(max(TICK_SECONDS, self._next_listing - self._clock()))

    def _stop_prefetching(self) -> None:
        """Stop the reading thread (after its current request) and take what it read, so nothing is read twice."""
        thread, self._prefetcher = self._prefetcher, None
        if thread is None:
            return
        self._prefetch_stop.set()
        thread.join()
        with self._prefetch_lock:
            self._leftover, self._ready = self._ready, []

    def _read(self, final: bool, max_bytes: int | None) -> list[tuple[float | None, Event]]:
        events: list[tuple[float | None, Event]] = list(self._leftover)
        self._leftover = []
        if self.appends or not self._appended_checked:
            try:
                events += self.appended.read_new(final or not self.appends, max_bytes)
                # In a store it is complete: read on until its end (a bounded read stops sooner), then never again.
                self._appended_checked = self.appended.at_end
            except OSError:
                self.appended.lines.at_end = True  # absent (a run in segments only), or refused and named
                self._appended_checked = True
            except Exception as error:  # noqa: BLE001 - a store that does not answer: asked again next time
                self.unreachable = f"{type(error).__name__}: {error}"
                self.appended.lines.at_end = False
        if final or self._clock() >= self._next_listing:
            self._list_segments()
        if self.appended.at_end:  # the appended file's events come first
            while (due := self._next_segment(final)) is not None:
                writer, seq = due
                read = self._read_segment(self._waiting[writer][seq])
                if read is None:
                    break  # the store did not answer: this segment is read again at the next call
                self._took(writer, seq)
                events += read
                if max_bytes is not None:
                    break  # one segment a call when reading in bounded pieces
        # Kept apart from ``at_end`` and ``finished``: with prefetching, those say what the caller has taken.
        # At the end: nothing more can be read now (segments held behind a gap wait for a later call).
        self._read_at_end = self.appended.at_end and self._next_segment(final) is None
        self._read_finished = self._read_finished or self.appended.finished
        return events

    def _list_segments(self) -> None:
        self.listings += 1
        try:
            listed = self.files.list(self.stream)
        except Exception as error:  # noqa: BLE001 - a store's client raises its own types when unreachable
            self.unreachable = f"{type(error).__name__}: {error}"
            self._next_listing = self._clock() + MAX_LIST_SECONDS
            return
        self.unreachable = None
        names = [name for name in listed if name not in self._seen]
        self._seen.update(names)
        new = False
        for name in names:
            if name.startswith("."):
                continue  # a writer's temporary file (a local spill): it becomes a segment under its own name
            parsed = parse_segment_name(name)
            if parsed is None:
                self._misnamed_count += 1
                if len(self._misnamed) < MISNAMED_SHOWN:
                    self._misnamed.append(name)
                continue
            writer, seq = parsed
            self._waiting.setdefault(writer, {})[seq] = name
            new = True
        # Nothing new: look less often, up to MAX_LIST_SECONDS; something new: back to every list_every.
        self._quiet_interval = self.list_every if new else min(MAX_LIST_SECONDS, self._quiet_interval * 2)
        # While a gap is open, look every list_every: the segment it waits for is read as soon as it is listed.
        self._next_listing = self._clock() + (self.list_every if self._gap_since else self._quiet_interval)

    def _next_segment(self, final: bool) -> tuple[str, int] | None:
        """The (writer, sequence number) to read next, or None: none listed, or each writer's held behind a gap.

        Writers in the order of their names, each one's segments in order; a
        writer whose next segment is not listed while a later one is waits up
        to GAP_WAIT_SECONDS (not when ``final``), then reads on.
        """
        now = self._clock()
        for writer in sorted(self._waiting):
            seq = min(self._waiting[writer])
            if seq > self._next_seq.get(writer, 1) and not final:
                since = self._gap_since.setdefault(writer, now)
                if now - since < GAP_WAIT_SECONDS:
                    continue  # held: the gap may yet fill
            return writer, seq
        return None

    def _took(self, writer: str, seq: int) -> None:
        """Segment ``seq`` of ``writer`` was read: what comes next for that writer, and what was out of order."""
        expected = self._next_seq.get(writer, 1)
        where = f"{self.stream}/{writer}"
        if seq > expected:
            count = seq - expected
            missing = f"{where}-{expected:08d}.jsonl" + (f" to -{seq - 1:08d}.jsonl" if count > 1 else "")
            self._order_problem(
                f"{missing}: {'missing' if count == 1 else f'{count} segments missing'}"
                f" (the writer's next is {seq:08d}); read on without {'it' if count == 1 else 'them'}"
            )
        elif seq < expected:
            self._order_problem(
                f"{where}-{seq:08d}.jsonl: came late, after {writer}-{expected - 1:08d}.jsonl;"
                " its events were read after later ones"
            )
        self._next_seq[writer] = max(expected, seq + 1)
        self._gap_since.pop(writer, None)
        del self._waiting[writer][seq]
        if not self._waiting[writer]:
            del self._waiting[writer]

    def _order_problem(self, line: str) -> None:
        self._order_problem_count += 1
        if len(self._order_problems) < MAX_ORDER_PROBLEMS:
            self._order_problems.append(line)

    @property
    def segment_problems(self) -> list[str]:
        """What the listing held that a writer never leaves: segments missing or late, files not named as segments."""
        lines = list(self._order_problems)
        if self._order_problem_count > len(self._order_problems):
            more = self._order_problem_count - len(self._order_problems)
            lines.append(f"{self.stream}/: {more} more segment{'' if more == 1 else 's'} missing or late")
        if self._misnamed_count:
            count = self._misnamed_count
            shown = ", ".join(f"{name!r:.60}" for name in self._misnamed) + (
                ", …" if count > len(self._misnamed) else ""
            )
            lines.append(
                f"{self.stream}/: {count} file{'' if count == 1 else 's'} not named as a segment ({SEGMENT_RULE}),"
                f" never read: {shown}"
            )
        return lines

    def _read_segment(self, name: str) -> list[tuple[float | None, Event]] | None:
        """A segment's events, read whole; None when the store failed to answer (it is read again later)."""
        relative = f"{self.stream}/{name}"
        tail = EventTail(PurePosixPath(relative), opener=lambda: self.files.open(relative))
        events: list[tuple[float | None, Event]] = []
        try:
            for item in tail.read_all():  # a segment is complete: read to its end, in chunks
                events.append(item)
        except FileNotFoundError:
            return []  # listed, then removed (a spill directory emptied by its upload)
        except RefusedFile:
            pass  # named in the tail's problems: never read
        except Exception as error:  # noqa: BLE001 - a store's client raises its own types when unreachable
            self.unreachable = f"{type(error).__name__}: {error}"
            return None  # nothing of it is kept, so a later read never repeats an event
        finally:
            tail.close()
        self.segments_read += 1
        self._read_finished = self._read_finished or tail.finished
        if tail.problem_count:
            self._segment_tails.append(tail)
        return events

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

        Then ``segment_problems``: segments missing or late, files not named as segments.
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
        self._prefetch_stop.set()  # the thread ends after its current request; nothing waits for it here
        self.appended.close()
