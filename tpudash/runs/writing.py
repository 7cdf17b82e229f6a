"""Writing runs into a runs directory: create one, join one as a cluster's worker, and end one whose writer died.

``RunWriter`` hands out the recorder that fits where the run is: a
``RunRecorder`` appending to a directory on this host, a ``StoreRecorder``
uploading segments to a store, a ``JoinedRecorder`` for a training
cluster's other workers. ``RunStore`` (``tpudash.runs.store``) is the
facade the rest of the code calls; this is its writing part.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.events import Event, Metric, RunFinished, RunStarted
from tpudash.runs import liveness
from tpudash.runs.backends import BucketRoot, LocalRoot, RunFiles
from tpudash.runs.layout import (
    MAX_RUN_FILE_BYTES,
    RUN_FILE,
    SOURCE_JOB,
    STATUS_RUNNING,
    checked_run_id,
    parse_run_file,
    readable_run_name,
)
from tpudash.runs.recorder import RunRecorder
from tpudash.runs.segments import StreamTail
from tpudash.runs.tail import fold_events
from tpudash.runs.uploader import StoreRecorder
from tpudash.runs.worker_recorder import JoinedRecorder
from tpudash.runs.workers import WorkerIdentity

Recorder = RunRecorder | StoreRecorder | JoinedRecorder


class RunWriter:
    """The writing part of a runs directory (``backend``); ``spill_root``: where a store's writers keep what is unsent."""

    def __init__(
        self, backend: LocalRoot | BucketRoot, spill_root: Path | None, events_of: Callable[[str], StreamTail]
    ) -> None:
        self.backend = backend
        self.spill_root = spill_root
        self._events_of = events_of

    def files(self, run_id: str) -> RunFiles:
        return self.backend.files(run_id)

    def create(
        self,
        run_id: str,
        job: str,
        params: dict,
        runtime: dict,
        *,
        source: str = SOURCE_JOB,
        flush_interval: float = 0.0,
        name: str | None = None,
        worker: WorkerIdentity | None = None,
    ) -> Recorder:
        """A new run and its recorder: see ``RunStore.create``."""
        meta = {
            "source": source,
            "run_id": checked_run_id(run_id),
            "job": job,
            "name": name or readable_run_name(job, params),
            "params": params,
            "runtime": runtime,
            "status": STATUS_RUNNING,
            "started": time.time(),
            "finished": None,
            "pid": os.getpid(),
            "pid_start_time": liveness.process_start_time(os.getpid()),
            "host": socket.gethostname(),
        }
        if worker is not None:
            if not worker.is_chief:
                raise ValueError(
                    f"worker: {worker.index} is not the chief (0); the chief creates the run, others join it"
                )
            meta["workers"] = {"count": worker.count}
            if self.files(run_id).key(RUN_FILE) is not None:
                raise FileExistsError(f"run {run_id} exists already in {self.backend.where}; give each run its own id")
        return self.recorder(run_id, meta, new=True, flush_interval=flush_interval, worker=worker)

    def join(self, run_id: str, job: str, params: dict, runtime: dict, *, worker: WorkerIdentity) -> JoinedRecorder:
        """A non-chief worker's recorder of the run its chief creates: see ``RunStore.join``."""
        if worker.is_chief:
            raise ValueError("worker: the chief (0) creates the run with create(); the other workers join it")
        meta = {
            "run_id": checked_run_id(run_id),
            "job": job,
            "params": params,
            "runtime": runtime,
            "worker": worker.index,
        }
        return JoinedRecorder(self.files(run_id), meta, worker=worker, spill_root=self.spill_root)

    def recorder(
        self,
        run_id: str,
        meta: dict,
        *,
        new: bool = False,
        flush_interval: float = 0.0,
        worker: WorkerIdentity | None = None,
    ) -> Recorder:
        """The recorder of a run whose record is ``meta``: appending on this host's disk, in segments in a store."""
        files = self.files(run_id)
        run_dir = files.local_dir
        if run_dir is not None:
            if new:
                # A cluster's other workers may have made the directory first (their streams).
                run_dir.mkdir(parents=True, exist_ok=worker is not None)
            return RunRecorder(run_dir, meta, flush_interval=flush_interval, worker=worker)
        return StoreRecorder(files, meta, spill_root=self.spill_root, worker=worker)

    def finish_abandoned(self, run_id: str, job: str, params: dict, status: str, error: str | None) -> OSError | None:
        """End a run whose writer died: see ``RunStore.finish_abandoned``."""
        latest: dict[str, Metric] = {}  # per metric, its last point: what run.json's final_metrics keeps
        ended, events_seen = False, 0

        def visit(stamp: float | None, event: Event) -> None:
            nonlocal ended, events_seen
            events_seen += 1
            ended = ended or isinstance(event, RunFinished)
            if isinstance(event, Metric):
                latest[event.final_name] = event

        fold_events(self._events_of(run_id), visit)  # in bounded memory, whatever the run holds
        if ended:
            return None
        try:
            # A regular file only, capped: never a FIFO that would block the lane.
            meta = parse_run_file(self.files(run_id).read(RUN_FILE, MAX_RUN_FILE_BYTES))
        except (OSError, ValueError):
            meta = None
        try:
            return self._write_finish(run_id, job, params, status, error, events_seen, list(latest.values()), meta)
        except OSError as write_error:
            return write_error

    def _write_finish(
        self,
        run_id: str,
        job: str,
        params: dict,
        status: str,
        error: str | None,
        events_seen: int,
        metrics: list[Metric],
        meta: Any,
    ) -> OSError | None:
        if not isinstance(meta, dict):
            if self.files(run_id).exists():
                recorder = self.recorder(
                    run_id,
                    {
                        "run_id": run_id,
                        "job": job,
                        "params": params,
                        "status": STATUS_RUNNING,
                        "started": time.time(),
                        "host": socket.gethostname(),
                    },
                )
            else:
                recorder = self.create(run_id, job, params, {})
            if not events_seen:
                recorder.record(RunStarted(run_id, job, params, {}, time.time()))
        else:
            recorder = self.recorder(run_id, meta)
        for metric in metrics:
            recorder.remember_metric(metric)
        recorder.record(RunFinished(status=status, summary={}, error=error, traceback=None))
        return recorder.write_error
