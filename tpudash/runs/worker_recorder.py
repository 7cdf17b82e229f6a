"""The writing side of a run with many workers: each worker's heartbeat, and a non-chief worker's recorder.

``WorkerHeartbeat`` replaces ``writers/<writer>.json`` in the run (a local
directory or a store) every ``liveness.HEARTBEAT_INTERVAL_SECONDS`` on a
thread of its own, with the worker's index, progress and time per step
(``workers.heartbeat_payload``); the training thread only feeds it events.
The chief's recorders (``RunRecorder``, ``StoreRecorder``) run one beside
their own liveness; a non-chief worker's ``JoinedRecorder`` is nothing else
but that and its events: it never writes run.json, and its events go to the
stream ``worker-<index>`` as segments (``segment_writer.SegmentWriter``), locally
as in a store, so the run's ``events`` stay the chief's.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.events import Event, Metric, RunFinished, dumps
from tpudash.runs.backends import LocalRunFiles, RunFiles
from tpudash.runs.liveness import HEARTBEAT_INTERVAL_SECONDS, WRITERS_FOLDER
from tpudash.runs.spill import forget_local_dir
from tpudash.runs.uploader import FINISH_WAIT_SECONDS, SEAL_SECONDS, SegmentWriter, local_run_dir, say_on_stderr
from tpudash.runs.workers import StepTimer, WorkerIdentity, heartbeat_payload, worker_stream

STATUS_WRITING = "running"


class WorkerHeartbeat:
    """One worker's heartbeat file, refreshed on a daemon thread; ``observe`` feeds its step times.

    A write that fails (a store away, a full disk) is tried again at the next beat.
    """

    def __init__(
        self,
        files: RunFiles,
        writer: str,
        worker: WorkerIdentity,
        *,
        interval: float = HEARTBEAT_INTERVAL_SECONDS,
    ) -> None:
        self.files = files
        self.writer = writer
        self.worker = worker
        self.interval = interval
        self.timer = StepTimer()
        self.status = STATUS_WRITING
        self.beats = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return f"{WRITERS_FOLDER}/{self.writer}.json"

    def start(self) -> WorkerHeartbeat:
        self._thread = threading.Thread(target=self._beat_periodically, name=f"tpudash-worker-beat-{self.writer}")
        self._thread.daemon = True
        self._thread.start()
        return self

    def observe(self, event: Event, timestamp: float) -> None:
        with self._lock:
            self.timer.observe(event, timestamp)

    def payload(self) -> dict[str, Any]:
        with self._lock:
            return heartbeat_payload(self.writer, self.worker, self.timer, status=self.status)

    def beat(self) -> bool:
        """Write the heartbeat now; whether it was written."""
        try:
            self.files.write(self.name, json.dumps(self.payload(), sort_keys=True).encode())
        except Exception:  # noqa: BLE001 - a store away or a full disk: the next beat tries again
            return False
        self.beats += 1
        return True

    def _beat_periodically(self) -> None:
        while True:
            self.beat()
            if self._stop.wait(self.interval):
                return

    def stop(self, status: str | None = None, timeout: float = FINISH_WAIT_SECONDS) -> None:
        """Stop beating; with ``status`` (how the worker ended), one last beat says it, within ``timeout``."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if status is not None:
            self.status = status
            done = threading.Event()

            def last_beat() -> None:
                self.beat()
                done.set()

            # On a thread of its own: a store's client may retry for longer than the caller may wait.
            threading.Thread(target=last_beat, name=f"tpudash-worker-last-beat-{self.writer}", daemon=True).start()
            done.wait(timeout)


class JoinedRecorder:
    """A non-chief worker's recorder of a run the chief creates (``RunStore.join``); ``RunRecorder``'s interface.

    Its events go to the stream ``worker-<index>`` of the run, its heartbeat
    to ``writers/<writer>.json``; run.json is the chief's alone. Nothing
    waits for the store but the finish (at most ``finish_wait`` seconds);
    what the store did not take stays in ``run_dir``, as ``StoreRecorder``
    leaves it.
    """

    def __init__(
        self,
        files: RunFiles,
        meta: dict[str, Any],
        *,
        worker: WorkerIdentity,
        spill_root: Path | None = None,
        seal_seconds: float = SEAL_SECONDS,
        finish_wait: float = FINISH_WAIT_SECONDS,
        notify: Callable[[str], None] | None = None,
    ) -> None:
        self.files = files
        self.meta = dict(meta)
        self.worker = worker
        self.finish_wait = finish_wait
        self.notify = notify or say_on_stderr
        self.write_error: OSError | None = None
        self.kept_locally: Path | None = None
        run_id = str(meta["run_id"])
        self.run_dir = local_run_dir(spill_root, run_id)
        """This worker's local directory of the run: what the store (or the disk) has not taken yet."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._closed = False
        self.events = SegmentWriter(
            files,
            LocalRunFiles(self.run_dir),
            stream=worker_stream(worker.index),
            seal_seconds=seal_seconds,
            notify=lambda line: self.notify(line),
        )
        self.writer = self.events.writer
        self.heartbeat = WorkerHeartbeat(files, self.writer, worker).start()

    @property
    def where(self) -> str:
        return self.files.where

    def remember_metric(self, event: Metric) -> None:
        """run.json's final metrics are the chief's: a non-chief keeps none."""

    def record(self, event: Event, timestamp: float | None = None) -> None:
        """Add one event to this worker's stream; never waits for the store, but at the finish."""
        timestamp = time.time() if timestamp is None else timestamp
        with self._lock:
            if self._closed:
                return
            self.events.write(dumps(event, timestamp) + "\n")
            self.heartbeat.observe(event, timestamp)
            if isinstance(event, RunFinished):
                self._closed = True
        if isinstance(event, RunFinished):
            self._end(event.status)

    def flush(self) -> None:
        self.events.seal_now()

    def wait_uploaded(self, timeout: float) -> bool:
        return self.events.wait_uploaded(timeout)

    def close(self) -> None:
        """Upload what is buffered and stop, without a finish: the heartbeat is left to age."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._end(None)

    def _end(self, status: str | None) -> None:
        deadline = time.monotonic() + self.finish_wait
        complete = self.events.finish(deadline)
        self.heartbeat.stop(status, timeout=max(0.1, deadline - time.monotonic()))
        if complete:
            forget_local_dir(self.run_dir)  # empty folders only: another writer's files stay
            return
        left = self.events.keep_rest()
        self.kept_locally = self.run_dir
        self.notify(
            f"run {self.meta['run_id']} (worker {self.worker.index}): {left} events could not be written to "
            f"{self.files.where} within {self.finish_wait:g} s ({self.events.last_error}); kept in {self.run_dir}"
        )
