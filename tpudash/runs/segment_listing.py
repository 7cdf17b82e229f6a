"""Which segment of a run's stream to read next: segment names, the listing's schedule, order per writer, gaps.

An object store has no append, so a writer there puts its events in
segments it never touches again, ``events/<writer>-<seq>.jsonl``
(``telemetry/…`` likewise): ``writer`` is unique to one writer of one run
(host, pid and a random token), ``seq`` counts from 1 with no gaps, so two
writers never overwrite each other and an upload retried after a failure
writes the same object again. This module names segments (the writers'
side: ``new_writer_id``, ``segment_name``) and, for a reader, keeps a
``SegmentListing``: it lists a stream's folder at most once every
``list_every`` seconds, less often (doubling, up to ``MAX_LIST_SECONDS``)
while nothing new appears, so following a quiet run costs a store a few
requests a minute, and says which listed segment comes next. It reads no
segment itself (``segments.StreamTail`` does).

What a listing may hold that a writer never leaves is said, as the run's
problems (``problems``), never skipped in silence:

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

import os
import re
import secrets
import socket
import time
from collections.abc import Callable
from typing import Protocol

LIST_SECONDS = 1.0
MAX_LIST_SECONDS = 8.0
SEGMENT_PATTERN = re.compile(r"^(?P<writer>[A-Za-z0-9_.-]{1,96})-(?P<seq>[0-9]{8})\.jsonl$")
SEGMENT_RULE = "<writer>-<8 digits, from 00000001>.jsonl"
"""A segment's name, as a problem line says it."""
GAP_WAIT_SECONDS = 10.0
"""How long a follower holds a writer's segments back while an earlier one is not listed (module docstring)."""
MAX_ORDER_PROBLEMS = 20
"""Lines about missing and late segments kept for ``problems``; more are counted in one line."""
MISNAMED_SHOWN = 3
"""Names of files that are not segments quoted in their one line; more are counted."""


def new_writer_id() -> str:
    """``tpu-vm-0-4242-1a2b3c``: this host, this process and a token, in characters every store allows."""
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


class Lister(Protocol):
    """What a listing asks: a run's files (``backends.RunFiles``), of which it needs only ``list``."""

    def list(self, folder: str) -> list[str]: ...


class SegmentListing:
    """A stream's segments as listed so far, and the next one to read; see the module docstring.

    ``refresh`` lists the folder (when ``due``); ``next_segment`` says which
    listed segment comes next; ``took`` says it was read. ``problems`` names
    what the listings held that a writer never leaves.
    """

    def __init__(
        self,
        files: Lister,
        stream: str,
        *,
        list_every: float = LIST_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.files = files
        self.stream = stream
        self.list_every = list_every
        self._clock = clock
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
        self.next_listing = 0.0
        """When (``clock``) the next listing is due."""
        self._quiet_interval = list_every
        """How long to wait before the next listing while nothing new comes: doubles each time, up to the cap."""
        self.listings = 0
        """How many times the segments were listed: a store's requests, for the benchmark."""

    def due(self, final: bool) -> bool:
        """Whether to list now: the schedule says so, or the reading is final (the writer is gone)."""
        return final or self._clock() >= self.next_listing

    def refresh(self) -> str | None:
        """List the folder; None, or why the store did not answer (the next listing then waits the longest)."""
        self.listings += 1
        try:
            listed = self.files.list(self.stream)
        except Exception as error:  # noqa: BLE001 - a store's client raises its own types when unreachable
            self.next_listing = self._clock() + MAX_LIST_SECONDS
            return f"{type(error).__name__}: {error}"
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
        self.next_listing = self._clock() + (self.list_every if self._gap_since else self._quiet_interval)
        return None

    def next_segment(self, final: bool) -> tuple[str, int] | None:
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

    def name(self, writer: str, seq: int) -> str:
        """The listed name of a writer's segment, relative to the run (``events/w-00000001.jsonl``)."""
        return f"{self.stream}/{self._waiting[writer][seq]}"

    def took(self, writer: str, seq: int) -> None:
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
    def problems(self) -> list[str]:
        """What the listings held that a writer never leaves: segments missing or late, files not named as segments."""
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
