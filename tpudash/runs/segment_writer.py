"""A run's stream written into an object store as immutable segments, without ever making its writer wait.

``SegmentWriter`` takes a stream's lines into memory. Its sealing thread
closes a segment every ``seal_seconds`` (or ``SEGMENT_BYTES``), named before
its first upload (``segments``); its uploading thread puts the closed
segments into the store in order, retrying a failure with backoff
(``RETRY_SECONDS`` doubling to ``MAX_RETRY_SECONDS``). The two are apart so
that a store that hangs (a client retrying inside one call: gcsfs tries six
times over half a minute) holds up only the uploads: segments go on being
closed, and once the oldest has waited ``STALL_SECONDS``, or an upload has
failed, the store counts as unreachable and every closed segment is also
written to the run's local directory (``tpudash.runs.spill``), laid out as a
run, so a process that dies during an outage leaves its events on disk; past
``MAX_MEMORY_BYTES`` segments go to disk too. When the store answers again
the segments go up in order, each once, and ``on_outage`` hears when the
store went away and came back. Its users: a run's events
(``tpudash.runs.uploader.StoreRecorder``), the telemetry's stream and other
workers' streams.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from tpudash.runs.backends import LocalRunFiles, RunFiles
from tpudash.runs.segments import new_writer_id, segment_name

SEAL_SECONDS = 2.0
"""A reader following a run in a store is at most this (plus its listing interval) behind the writer."""
SEGMENT_BYTES = 256 << 10
MAX_MEMORY_BYTES = 32 << 20
STALL_SECONDS = 10.0
"""A closed segment not in the store after this long: the store counts as unreachable (its client may still be retrying)."""
RETRY_SECONDS = 0.5
MAX_RETRY_SECONDS = 30.0
TICK_SECONDS = 0.25


def say_on_stderr(line: str) -> None:
    """How a writer tells the user about its store (the training's own output is left alone)."""
    print(f"tpudash: {line}", file=sys.stderr)


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


@dataclass
class Segment:
    """A closed segment on its way to the store."""

    name: str
    data: bytes | None
    """Its bytes, or None once they are only in the local directory."""
    lines: int
    closed_at: float
    uploaded: bool = False


class SegmentWriter:
    """A run's events, uploaded as immutable segments by two threads; see the module docstring.

    ``write`` never blocks on the store. ``pending`` counts the lines not in
    the store yet; ``unreachable_since`` (wall time) is set while the store
    does not take them. ``on_outage`` hears a line when an outage starts and
    when it ends (the recorder puts both into the run's log); ``notify``
    says them to the user.
    """

    def __init__(
        self,
        files: RunFiles,
        spill: LocalRunFiles,
        *,
        stream: str = "events",
        writer: str | None = None,
        seal_seconds: float = SEAL_SECONDS,
        on_outage: Callable[[str], None] | None = None,
        notify: Callable[[str], None] | None = None,
    ) -> None:
        self.files = files
        self.spill = spill
        self.stream = stream
        self.writer = writer or new_writer_id()
        self.seal_seconds = seal_seconds
        self.on_outage = on_outage or (lambda line: None)
        self.notify = notify or say_on_stderr
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._lines: list[str] = []
        self._line_bytes = 0
        self._opened = time.monotonic()
        self._seq = 0
        self._queue: deque[Segment] = deque()
        self._memory_bytes = 0
        self.pending = 0
        self.unreachable_since: float | None = None
        self.last_error: str | None = None
        self._held_in_outage = 0
        self._coming_back = False
        """The last held segment is up and the outage's end is being said: waiters wait for it."""
        self._outage_on_disk = False
        self._retry_delay = RETRY_SECONDS
        self._stopping = False
        self.keeping_all = False
        """Set by ``keep_rest``: the local directory holds the whole run from then on, uploads or not."""
        self._sealer = threading.Thread(target=self._seal_periodically, name=f"tpudash-seal-{self.writer}", daemon=True)
        self._uploader = threading.Thread(
            target=self._upload_forever, name=f"tpudash-upload-{self.writer}", daemon=True
        )
        self._sealer.start()
        self._uploader.start()

    def write(self, line: str) -> None:
        """Add one line (with its newline). Never blocks on the store."""
        with self._lock:
            self._lines.append(line)
            self._line_bytes += len(line)
            self.pending += 1

    def seal_now(self) -> None:
        """Close the open segment now, on the caller's thread (no network: its upload is the uploader's)."""
        self._seal(force=True)

    def wait_uploaded(self, timeout: float) -> bool:
        """Close the open segment and wait until the store has every line written so far; whether it has."""
        self.seal_now()
        deadline = time.monotonic() + timeout
        with self._lock:
            return self._queue_emptied_by(deadline)

    def _queue_emptied_by(self, deadline: float) -> bool:
        """With the lock held: wait until every closed segment is uploaded, or the deadline; whether they were."""
        while self._queue or self._coming_back:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._changed.wait(left)
        return True

    def wait_for_outage(self, timeout: float) -> bool:
        """Wait until the writer counts the store as away (its segments are on local disk from then on)."""
        with self._lock:
            return self._changed.wait_for(lambda: self._outage_on_disk, timeout)

    # -- the sealing thread -------------------------------------------------------------------
    def _seal_periodically(self) -> None:
        while not self._stopping:
            time.sleep(TICK_SECONDS)  # a schedule, not a wait for another thread
            self._seal()
            self._watch_for_stall()

    def _seal(self, force: bool = False) -> None:
        """Close the open segment when it is old or large enough (or ``force``), and queue it for upload."""
        spill: list[Segment] = []
        with self._lock:
            due = self._line_bytes >= SEGMENT_BYTES or time.monotonic() - self._opened >= self.seal_seconds
            if not self._lines or not (force or due):
                if not self._lines:
                    self._opened = time.monotonic()
                return
            self._seq += 1
            data = "".join(self._lines).encode("utf-8")
            segment = Segment(segment_name(self.writer, self._seq), data, len(self._lines), time.monotonic())
            self._lines, self._line_bytes, self._opened = [], 0, time.monotonic()
            self._queue.append(segment)
            self._memory_bytes += len(data)
            if self.unreachable_since is not None:
                spill = [segment]
            elif self._memory_bytes > MAX_MEMORY_BYTES:
                spill = [item for item in self._queue if item.data is not None]
            self._changed.notify_all()
        self._spill_segments(spill)

    def _watch_for_stall(self) -> None:
        with self._lock:
            stalled = bool(self._queue) and time.monotonic() - self._queue[0].closed_at > STALL_SECONDS
        if stalled and self.unreachable_since is None:
            self._went_away(f"no answer for {STALL_SECONDS:g} s")

    def _spill_segments(self, segments: list[Segment]) -> None:
        """Keep segments on local disk (a process dying now loses none); a spill that fails keeps them in memory."""
        for segment in segments:
            data = segment.data
            if data is None:
                continue
            relative = f"{self.stream}/{segment.name}"
            try:
                self.spill.write(relative, data)
            except OSError as error:
                self.last_error = f"the local directory too: {describe(error)}"
                continue
            with self._lock:
                uploaded = segment.uploaded
                if not uploaded and segment.data is not None:
                    segment.data = None
                    self._memory_bytes -= len(data)
            if uploaded:  # the store took it while it was being written here: no copy to leave behind
                self._forget_spilled(relative)

    # -- the uploading thread -----------------------------------------------------------------
    def _upload_forever(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._stopping:
                    self._changed.wait()
                if not self._queue:
                    return
                segment = self._queue[0]
                data = segment.data
            relative = f"{self.stream}/{segment.name}"
            try:
                body = data if data is not None else self.spill.read(relative, 1 << 30)
                self.files.write(relative, body)
            except Exception as error:  # noqa: BLE001 - each store's client raises its own types when unreachable
                self.last_error = describe(error)
                if self.unreachable_since is None:
                    self._went_away(self.last_error)
                with self._lock:
                    self._changed.wait(self._retry_delay)  # a retry's backoff; a finish or a stop wakes it
                self._retry_delay = min(MAX_RETRY_SECONDS, self._retry_delay * 2)
                continue
            self._uploaded(segment, relative)

    def _uploaded(self, segment: Segment, relative: str) -> None:
        with self._lock:
            self._queue.popleft()
            segment.uploaded = True
            if segment.data is not None:
                self._memory_bytes -= len(segment.data)
            self.pending -= segment.lines
            outage_over = self.unreachable_since is not None and not self._queue
            if self.unreachable_since is not None:
                self._held_in_outage += segment.lines
            # Until the outage's end is said, nobody waiting hears the queue is empty (a wake-up for
            # another reason would otherwise find it so): its log line is then in the run.
            self._coming_back = outage_over
        self._retry_delay = RETRY_SECONDS
        self._forget_spilled(relative)
        try:
            if outage_over:
                self._came_back()
        finally:
            with self._lock:
                self._coming_back = False
                self._changed.notify_all()

    def _forget_spilled(self, relative: str) -> None:
        if self.keeping_all:
            return  # the run was kept locally whole: its local copy must stay complete
        try:
            (self.spill.run_dir / relative).unlink(missing_ok=True)
        except OSError:
            pass

    # -- outages ------------------------------------------------------------------------------
    def _went_away(self, reason: str) -> None:
        """The store stopped taking segments: from now on every closed segment is on disk too."""
        self.last_error = self.last_error or reason
        with self._lock:
            in_memory = [segment for segment in self._queue if segment.data is not None]
            self.unreachable_since = time.time()  # segments closed from now on are spilled as they close
        self._spill_segments(in_memory)
        with self._lock:
            self._outage_on_disk = True
            self._changed.notify_all()  # ``wait_for_outage``: the queue is on disk now
        line = self.status_line() or ""
        self.notify(f"{self.files.where}: {line}")
        self.on_outage(line)

    def _came_back(self) -> None:
        since, held = self.unreachable_since or time.time(), self._held_in_outage
        self.unreachable_since, self._held_in_outage, self.last_error = None, 0, None
        self._outage_on_disk = False
        line = (
            f"the store answered again after {time.time() - since:.0f} s; the {held} events held meanwhile are uploaded"
        )
        self.notify(f"{self.files.where}: {line}")
        self.on_outage(line)

    def status_line(self) -> str | None:
        """``store unreachable since 10:31:02, 312 events pending (kept in …)``, or None while the store answers."""
        if self.unreachable_since is None:
            return None
        since = datetime.fromtimestamp(self.unreachable_since).strftime("%H:%M:%S")
        return (
            f"store unreachable since {since}, {self.pending} events pending "
            f"(kept in {self.spill.where}; {self.last_error})"
        )

    # -- the end ------------------------------------------------------------------------------
    def finish(self, deadline: float) -> bool:
        """Close the open segment and wait until the store has every segment, or ``deadline`` (monotonic).

        Whether it has them all. The threads stop once it does; otherwise the
        uploader goes on trying while this process lives (``keep_rest`` has
        put everything on disk meanwhile).
        """
        self._seal(force=True)
        with self._lock:
            self._stopping = True
            self._changed.notify_all()
            return self._queue_emptied_by(deadline)

    def keep_rest(self) -> int:
        """Put every segment not in the store yet on local disk, for good; how many lines they hold."""
        self.keeping_all = True
        self._seal(force=True)
        with self._lock:
            waiting = list(self._queue)
        self._spill_segments(waiting)
        return sum(segment.lines for segment in waiting)
