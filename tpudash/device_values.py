"""Device values read off the training thread: ``DeviceValueReader``, which ``tpudash.record``'s runs write through.

A JAX value recorded in a training loop is the promise of a computation
the device may still be running; reading its number on the training thread
would make every step wait for the one before (the host sync a loop avoids).
The reader takes the event unbuilt, reads it on a thread of its own and
hands it on in the order of the calls. Imports neither JAX nor TensorFlow.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from jobs.events import Event, Log


class DeviceValueReader:
    """Reads device values (JAX arrays) on a thread of its own and records their events in the order of the calls.

    A JAX value is the promise of a computation still running: its number is
    there when the device is done. The training thread hands over a function
    that builds the event (reading the values) and goes on at once; this
    thread builds each in turn and records it with the time of the call.
    While one waits, events without device values queue behind it, so the
    record keeps the order of the calls. Started with the first device value:
    a loop that records plain numbers never has this thread.
    """

    def __init__(self, record: Callable[..., None], run_id: str):
        self._record = record
        self._run_id = run_id
        self._queue: deque[tuple[Callable[[], Event], float, str]] = deque()
        self._busy = False
        self._stopped = False
        self._condition = threading.Condition()
        self._thread: threading.Thread | None = None

    def record(self, event: Event) -> None:
        """Record ``event`` now, or behind the device values still being read."""
        with self._condition:
            if not self._queue and not self._busy:
                self._record(event)
                return
            self._queue.append((lambda: event, time.time(), ""))

    def later(self, build: Callable[[], Event], what: str) -> None:
        """Record the event ``build`` makes once its values are read; ``what`` names it if they cannot be."""
        with self._condition:
            if self._stopped:
                return
            self._queue.append((build, time.time(), what))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._read_forever, name=f"tpudash-read-{self._run_id}", daemon=True
                )
                self._thread.start()
            self._condition.notify_all()

    def wait(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for every value handed over so far; how many are still unread."""
        deadline = time.monotonic() + timeout
        with self._condition:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._condition.wait(left)
            return len(self._queue) + int(self._busy)

    def stop(self) -> None:
        """Read nothing more: what is still queued is dropped (the run has ended)."""
        with self._condition:
            self._stopped = True
            self._queue.clear()
            self._condition.notify_all()

    def _read_forever(self) -> None:
        while True:
            with self._condition:
                while not self._queue and not self._stopped:
                    self._condition.wait()
                if self._stopped:
                    return
                build, timestamp, what = self._queue.popleft()
                self._busy = True
            try:
                try:
                    event: Event = build()
                except Exception as error:  # noqa: BLE001 - a failed computation must not end the record
                    event = Log(
                        level="warning",
                        text=f"{what}: its value could not be read from the device ({type(error).__name__}: {error})",
                    )
                self._record(event, timestamp)
            finally:
                with self._condition:
                    self._busy = False
                    self._condition.notify_all()
