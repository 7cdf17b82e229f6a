"""Writes one run: its events.jsonl and its run.json, from a job, the user's fit or ``tpudash.record``.

events.jsonl is written through to the OS at every event, so a killed
process loses nothing it emitted, and fsynced at least every second and at
every epoch and finish, so a dead machine loses at most a second. run.json
is replaced atomically at the start, at epochs and at the finish.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from jobs.events import Event, Metric, Progress, RunFinished, dumps, to_jsonable
from tpudash.runs.layout import EVENTS_FILE, RUN_FILE, write_json_atomically

FSYNC_INTERVAL_SECONDS = 1.0


class RunRecorder:
    """Writes one run's events and its run.json; used as a runner sink.

    Write-through (the default, for jobs): every event reaches the OS as it
    is recorded, so the dashboard tailing the file sees it at once. Buffered
    (``flush_interval`` > 0, for the user's own training): ``record`` only
    appends to memory, and a writer thread writes every ``flush_interval``
    seconds, fsyncs at most every second and rewrites run.json at epochs, so
    the training thread never waits for the disk. Either way the finish is
    written and fsynced before ``record`` returns.
    """

    def __init__(self, run_dir: Path, meta: dict[str, Any], *, flush_interval: float = 0.0) -> None:
        self.run_dir = run_dir
        self.meta = dict(meta)
        self.flush_interval = flush_interval
        self.write_error: OSError | None = None
        """The first error the writer thread met (a full disk); training goes on without the record."""
        self._lock = threading.Lock()  # the buffer, meta and final metrics
        self._io_lock = threading.Lock()  # the files
        self._pending: list[str] = []
        self._meta_due = False
        self._unsynced = False
        self._last_fsync = time.monotonic()
        self._final_metrics: dict[str, float] = {}
        self._closed = False
        # run.json first: a reader finding the directory learns at once whose run it is.
        self._write_meta(self._meta_snapshot())
        self._events = open(run_dir / EVENTS_FILE, "a", encoding="utf-8")
        self._writer: threading.Thread | None = None
        self._writer_stop = threading.Event()
        if flush_interval > 0:
            self._writer = threading.Thread(
                target=self._write_periodically, name=f"tpudash-record-{run_dir.name}", daemon=True
            )
            self._writer.start()

    def _meta_snapshot(self) -> dict[str, Any]:
        return dict(self.meta, final_metrics=dict(self._final_metrics))

    def _write_meta(self, meta: dict[str, Any]) -> None:
        write_json_atomically(self.run_dir / RUN_FILE, to_jsonable(meta))

    def record(self, event: Event, timestamp: float | None = None) -> None:
        """Append one event; fsync on schedule, at epochs and at the finish."""
        timestamp = time.time() if timestamp is None else timestamp
        line = dumps(event, timestamp) + "\n"
        finished = event if isinstance(event, RunFinished) else None
        with self._lock:
            if self._closed:
                return
            self._pending.append(line)
            if isinstance(event, Metric):
                self.remember_metric(event)
            epoch_boundary = isinstance(event, Progress) and event.unit == "epoch"
            if epoch_boundary:
                self._meta_due = True
            if finished is not None:
                self._closed = True
                self.meta.update(
                    status=finished.status, finished=timestamp, summary=finished.summary, error=finished.error
                )
                self._meta_due = True
        if finished is not None:
            self._stop_writer()
            self._write_pending(sync=True)
            with self._io_lock:
                self._events.close()
        elif self._writer is None:
            self._write_pending(sync=epoch_boundary)

    def _write_pending(self, sync: bool = False) -> None:
        """Write what is buffered; fsync when asked, when run.json is due, or a second after the last."""
        with self._io_lock:
            with self._lock:
                lines, self._pending = self._pending, []
                meta = self._meta_snapshot() if self._meta_due else None
                self._meta_due = False
            if self._events.closed:
                return
            if lines:
                self._events.write("".join(lines))
                self._events.flush()
                self._unsynced = True
            now = time.monotonic()
            if self._unsynced and (sync or meta is not None or now - self._last_fsync >= FSYNC_INTERVAL_SECONDS):
                os.fsync(self._events.fileno())
                self._last_fsync, self._unsynced = now, False
            if meta is not None:
                self._write_meta(meta)

    def flush(self) -> None:
        """Write what is buffered now, and fsync it (a buffered recorder before a long pause)."""
        self._write_pending(sync=True)

    def _write_periodically(self) -> None:
        while not self._writer_stop.wait(self.flush_interval):
            try:
                self._write_pending()
            except OSError as error:
                # The user's training must go on; the error is kept for them to read.
                self.write_error = self.write_error or error

    def _stop_writer(self) -> None:
        if self._writer is not None:
            self._writer_stop.set()
            if self._writer is not threading.current_thread():
                self._writer.join()
            self._writer = None

    def remember_metric(self, event: Metric) -> None:
        """Keep ``event`` as its metric's latest value for run.json's final_metrics."""
        self._final_metrics[event.final_name] = event.value

    def close(self) -> None:
        """Write what is buffered and close, without a finish (the run reads as interrupted)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop_writer()
        self._write_pending(sync=True)
        with self._io_lock:
            self._events.close()
