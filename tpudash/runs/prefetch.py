"""Reading a run's stream on a thread of its own, so a UI's poll never waits for a store.

The dashboard polls a run it follows from its UI thread, several times a
second; in a store every read is a request that may take seconds. A
``Prefetcher`` reads on a daemon thread instead and keeps what it read
until the poll takes it (``take``): a poll returns at once with what has
come. The thread reads a piece at a time (``PREFETCH_BYTES``) and, while
more is there, reads the next piece only once the last was taken, so what
waits in memory is a piece, however large a segment the run holds; when
nothing more is there it waits until the next listing is due. ``stop``
ends the thread and hands back what it read and no one took, so a reader
that goes on on its own thread reads each event once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from jobs.events import Event

TICK_SECONDS = 0.1
"""The shortest wait between two reads of a thread that found nothing more to read."""
PREFETCH_BYTES = 1 << 20
"""What the thread reads before it waits for the poll to take it."""

Events = list[tuple[float | None, Event]]


class Prefetcher:
    """A reading thread and what it read, not yet taken; see the module docstring.

    ``read(max_bytes)`` reads the next piece and says whether it reached the
    end of what is there; ``pause()`` is how long to wait after reaching it
    (until the next listing is due). ``news`` is set when the thread has read
    events; whoever takes them may clear it.
    """

    def __init__(self, read: Callable[[int], tuple[Events, bool]], pause: Callable[[], float], name: str) -> None:
        self._read = read
        self._pause = pause
        self._name = name
        self.thread: threading.Thread | None = None
        self._changed = threading.Condition()
        self._stopping = False
        self._closed = False
        self._ready: Events = []
        self._at_end = False
        self.news = threading.Event()

    def take(self) -> tuple[Events, bool]:
        """What the thread read since the last take (starting it the first time), and whether that was all there is."""
        if self.thread is None and not self._closed:
            self._stopping = False
            self.thread = threading.Thread(target=self._read_forever, name=self._name, daemon=True)
            self.thread.start()
        with self._changed:
            events, self._ready = self._ready, []
            at_end = self._at_end and not events
            self._changed.notify_all()  # the thread may be waiting for this piece to be taken
        return events, at_end

    def _read_forever(self) -> None:
        while not self._stopping:
            events, at_end = self._read(PREFETCH_BYTES)
            with self._changed:
                self._ready += events
                self._at_end = at_end
                if events:
                    self.news.set()
                if events and not at_end:
                    # More is there now: read it once this piece is taken, so memory holds one piece.
                    self._changed.wait_for(lambda: self._stopping or not self._ready)
                else:
                    # Until the next listing is due (it backs off while nothing changes), or a stop.
                    self._changed.wait_for(lambda: self._stopping, max(TICK_SECONDS, self._pause()))

    def stop(self) -> Events:
        """End the thread (after its current request) and return what it read that no one took."""
        thread, self.thread = self.thread, None
        if thread is None:
            return []
        self._signal_stop()
        thread.join()
        with self._changed:
            events, self._ready = self._ready, []
        return events

    def close(self) -> None:
        """Tell the thread to end after its current request, without waiting for it; no thread starts again."""
        self._closed = True
        self._signal_stop()

    def _signal_stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
