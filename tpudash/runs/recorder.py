"""Writes one run: its events.jsonl and its run.json, from a job, the user's fit or ``tpudash.record``.

events.jsonl is written through to the OS at every event, so a killed
process loses nothing it emitted, and fsynced at least every second and at
every epoch and finish, so a dead machine loses at most a second. run.json
is replaced atomically at the start, at epochs and at the finish. While it
writes, the recorder holds the run's writer lock and refreshes its heartbeat
(``tpudash.runs.liveness``), so readers know the run is still growing. The
chief of a training cluster also keeps a worker's heartbeat,
``writers/<writer>.json``, on a thread of its own (``worker_recorder``).

A write that fails (a full disk, a quota, an I/O error, a file size limit)
never raises out of ``record``, ``flush`` or ``close``: the first error is
kept in ``write_error`` for the caller to act on (the engine's runner ends
the run as failed; the user's training goes on without its record). Every
write starts on a fresh line, so a line cut short by a failed write, or by a
writer killed mid-line before this one opened the file, never swallows the
next event.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from jobs.events import Event, Metric, Progress, RunFinished, RunStarted, dumps, is_sane_timestamp, to_jsonable
from tpudash.runs.backends import LocalRunFiles
from tpudash.runs.layout import EVENTS_FILE, RUN_FILE, open_regular_fd, write_json_atomically
from tpudash.runs.liveness import WriterLock
from tpudash.runs.segments import new_writer_id
from tpudash.runs.worker_recorder import WorkerHeartbeat
from tpudash.runs.workers import WorkerIdentity

FSYNC_INTERVAL_SECONDS = 1.0


def cannot_write(error: OSError) -> str:
    """How a run that could not be written says why: ``cannot write the run: [Errno 28] No space left on device``."""
    return f"cannot write the run: {error}"


class RunRecorder:
    """Writes one run's events and its run.json; used as a runner sink.

    Write-through (the default, for jobs): every event reaches the OS as it
    is recorded, so the dashboard tailing the file sees it at once. Buffered
    (``flush_interval`` > 0, for the user's own training): ``record`` only
    appends to memory, and a writer thread writes every ``flush_interval``
    seconds, fsyncs at most every second and rewrites run.json at epochs, so
    the training thread never waits for the disk. Either way the finish is
    written and fsynced before ``record`` returns.

    Only opening the run raises (run.json or the lock cannot be written);
    later write errors are kept in ``write_error``.
    """

    def __init__(
        self,
        run_dir: Path,
        meta: dict[str, Any],
        *,
        flush_interval: float = 0.0,
        worker: WorkerIdentity | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.meta = dict(meta)
        self.flush_interval = flush_interval
        self.write_error: OSError | None = None
        """The first write that failed (a full disk); what was being written is lost, later writes are tried."""
        self._lock = threading.Lock()  # the buffer, meta and final metrics
        self._io_lock = threading.Lock()  # the files
        self._pending: list[str] = []
        self._meta_due = False
        self._unsynced = False
        self._last_fsync = time.monotonic()
        self._final_metrics: dict[str, float] = {}
        self._closed = False
        self._finishing = False
        self._events_fd: int | None = None
        # The lock before run.json: a reader that finds run.json "running" finds its writer's lock too.
        self._writer_lock = WriterLock(run_dir)
        try:
            # run.json first: a reader finding the directory learns at once whose run it is.
            self._write_meta(self._meta_snapshot())
            self._events_fd, self._needs_newline = _open_events(run_dir / EVENTS_FILE)
        except BaseException:
            self._writer_lock.release()
            raise
        self._writer_lock.start()
        self.heartbeat: WorkerHeartbeat | None = None
        """The chief's worker heartbeat (``writers/<writer>.json``), when it records for a cluster."""
        if worker is not None:
            self.heartbeat = WorkerHeartbeat(LocalRunFiles(run_dir), new_writer_id(), worker).start()
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
        """Append one event; fsync on schedule, at epochs and at the finish. Never raises for a failed write."""
        timestamp = time.time() if timestamp is None else timestamp
        line = dumps(event, timestamp) + "\n"
        finished = event if isinstance(event, RunFinished) else None
        with self._lock:
            if self._closed:
                return
            self._pending.append(line)
            if self.heartbeat is not None:
                self.heartbeat.observe(event, timestamp)
            if isinstance(event, Metric):
                self.remember_metric(event)
            epoch_boundary = isinstance(event, Progress) and event.unit == "epoch"
            if epoch_boundary:
                self._meta_due = True
            if isinstance(event, RunStarted) and is_sane_timestamp(event.time):
                # One start for every reader: run.json's (History, `tpudash runs`)
                # is the event's (the run view), so both show the same duration.
                self.meta["started"] = event.time
                self._meta_due = True
            if finished is not None:
                self._closed = self._finishing = True
                self.meta.update(
                    status=finished.status, finished=timestamp, summary=finished.summary, error=finished.error
                )
                self._meta_due = True
        if finished is not None:
            self._stop_writer()
            try:
                self._write_pending(sync=True)
            finally:
                self._close_files()
        elif self._writer is None:
            self._write_pending(sync=epoch_boundary)

    def _write_pending(self, sync: bool = False) -> None:
        """Write what is buffered; fsync when asked, when run.json is due, or a second after the last.

        A failure is kept in ``write_error`` and what was buffered is dropped
        (memory stays bounded on a full disk); run.json is still tried, as it
        may fit where the events did not.
        """
        with self._io_lock:
            with self._lock:
                lines, self._pending = self._pending, []
                meta = self._meta_snapshot() if self._meta_due else None
                self._meta_due = False
            if self._events_fd is None:
                return
            try:
                if lines:
                    self._append("".join(lines).encode("utf-8"))
                    self._unsynced = True
                now = time.monotonic()
                if self._unsynced and (sync or meta is not None or now - self._last_fsync >= FSYNC_INTERVAL_SECONDS):
                    os.fsync(self._events_fd)
                    self._last_fsync, self._unsynced = now, False
            except OSError as error:
                self._failed(error)
                if meta is not None and self._finishing:
                    # The finish is not in events.jsonl: run.json must not say the run ended as it meant to.
                    meta.update(status="failed", error=cannot_write(self.write_error or error))
            if meta is not None:
                try:
                    self._write_meta(meta)
                except OSError as error:
                    self._failed(error)

    def _append(self, data: bytes) -> None:
        """Write ``data`` whole at the end of events.jsonl, after a newline if the file ends mid-line."""
        assert self._events_fd is not None
        if self._needs_newline:
            data = b"\n" + data
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                written += os.write(self._events_fd, view[written:])
        finally:
            if written:
                # Cut short (a size limit, a full disk): the next write starts on a fresh line.
                self._needs_newline = data[written - 1 : written] != b"\n"

    def _failed(self, error: OSError) -> None:
        if self.write_error is None:
            self.write_error = error

    def flush(self) -> None:
        """Write what is buffered now, and fsync it (a buffered recorder before a long pause)."""
        self._write_pending(sync=True)

    def _write_periodically(self) -> None:
        while not self._writer_stop.wait(self.flush_interval):
            self._write_pending()

    def _stop_writer(self) -> None:
        if self._writer is not None:
            self._writer_stop.set()
            if self._writer is not threading.current_thread():
                self._writer.join()
            self._writer = None

    def _close_files(self) -> None:
        """Close events.jsonl and let go of the writer lock: readers now see the writer gone."""
        if self.heartbeat is not None:
            # A finish says how this worker ended; a close leaves its heartbeat to age, as a killed one's.
            self.heartbeat.stop(self.meta.get("status") if self._finishing else None)
        with self._io_lock:
            fd, self._events_fd = self._events_fd, None
            if fd is not None:
                try:
                    os.close(fd)
                except OSError as error:
                    self._failed(error)
            self._writer_lock.release()

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
        try:
            self._write_pending(sync=True)
        finally:
            self._close_files()


def _open_events(path: Path) -> tuple[int, bool]:
    """events.jsonl opened for appending (created if need be), and whether it ends mid-line.

    A writer killed mid-write leaves a partial last line; whatever is
    appended next must start on a line of its own. Links are not followed
    and only a regular file is accepted.
    """
    fd = open_regular_fd(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    try:
        status = os.fstat(fd)
        needs_newline = status.st_size > 0 and os.pread(fd, 1, status.st_size - 1) != b"\n"
    except BaseException:
        os.close(fd)
        raise
    return fd, needs_newline
