"""Writing one run into an object store: ``StoreRecorder``, ``recorder.RunRecorder`` for a store.

Its events go up as segments through a ``SegmentWriter``
(``tpudash.runs.segment_writer``: training never waits for the network, an
outage spills to the run's local directory). Beside them it keeps run.json,
replaced whole at the start, at epochs and at the finish, and the writer's
heartbeat (``writers/<writer>.json``, every
``liveness.HEARTBEAT_INTERVAL_SECONDS``): in a store the heartbeat is how any
reader, on any host, tells a live writer from a stale one. The finish waits
at most ``finish_wait`` seconds for the store, whatever its client does;
what is left stays in the local directory (``tpudash.runs.spill``), and one
line on stderr says where and how to upload it later (``tpudash copy``).

The segment writer's and the local directory's names are importable from
here too, as they were before they had modules of their own.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.events import Event, Log, Metric, Progress, RunFinished, RunStarted, dumps, is_sane_timestamp, to_jsonable
from tpudash.runs.backends import LocalRunFiles, RunFiles
from tpudash.runs.layout import RUN_FILE, record_bytes
from tpudash.runs.liveness import HEARTBEAT_INTERVAL_SECONDS, WRITERS_FOLDER
from tpudash.runs.segment_writer import (
    MAX_MEMORY_BYTES,
    MAX_RETRY_SECONDS,
    RETRY_SECONDS,
    SEAL_SECONDS,
    SEGMENT_BYTES,
    STALL_SECONDS,
    TICK_SECONDS,
    Segment,
    SegmentWriter,
    describe,
    say_on_stderr,
)
from tpudash.runs.spill import (
    SPILLED,
    default_spill_dir,
    forget_local_dir,
    is_spilled,
    local_run_dir,
    upload_artifacts,
)
from tpudash.runs.storeclient import held_by
from tpudash.runs.workers import StepTimer, WorkerIdentity, heartbeat_payload

__all__ = [
    "FINISH_WAIT_SECONDS",
    "MAX_MEMORY_BYTES",
    "MAX_RETRY_SECONDS",
    "RETRY_SECONDS",
    "SEAL_SECONDS",
    "SEGMENT_BYTES",
    "SPILLED",
    "STALL_SECONDS",
    "TICK_SECONDS",
    "Segment",
    "SegmentWriter",
    "StoreRecorder",
    "default_spill_dir",
    "describe",
    "is_spilled",
    "local_run_dir",
    "say_on_stderr",
]

FINISH_WAIT_SECONDS = 10.0


class StoreRecorder:
    """Writes one run into a store (``RunRecorder``'s interface); see the module docstring.

    ``run_dir`` is a local directory for the run's own files (a job's
    TensorBoard logs, the telemetry sampled on this host): it is the run's
    spill directory, and what is in it beside the spilled segments is
    uploaded at the finish.
    """

    def __init__(
        self,
        files: RunFiles,
        meta: dict[str, Any],
        *,
        spill_root: Path | None = None,
        seal_seconds: float = SEAL_SECONDS,
        finish_wait: float = FINISH_WAIT_SECONDS,
        notify: Callable[[str], None] | None = None,
        worker: WorkerIdentity | None = None,
    ) -> None:
        self.files = files
        self.meta = dict(meta)
        self.worker = worker
        """The chief of a cluster (its heartbeat carries its step stats), or None: the run's only writer."""
        self._step_timer = StepTimer()
        self._status: str | None = None
        self.finish_wait = finish_wait
        self.notify = notify or say_on_stderr
        self.write_error: OSError | None = None
        """Set only when neither the store nor the local disk took the run's end."""
        self.kept_locally: Path | None = None
        """Where what could not be uploaded was kept, once the run is closed; None when the store took it all."""
        run_id = str(meta["run_id"])
        self.run_dir = local_run_dir(spill_root, run_id)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._spill = LocalRunFiles(self.run_dir)
        self._lock = threading.Lock()
        self._record_lock = threading.Lock()
        self._final_metrics: dict[str, float] = {}
        self._meta_due = True
        self._closed = False
        self._abandoned = False
        self.events = SegmentWriter(
            files, self._spill, seal_seconds=seal_seconds, on_outage=self._log_outage, notify=self._say
        )
        self.writer = self.events.writer
        # While the store is away, whoever draws a run in this process says how many events this writer holds.
        self._forget_held = held_by(files.where, lambda: self.events.pending)
        self.record_uploaded = threading.Event()
        """Set once run.json is in the store (after the first heartbeat): a reader then finds the run live."""
        self._side_stop = threading.Event()
        self._side = threading.Thread(target=self._keep_up, name=f"tpudash-record-{run_id}", daemon=True)
        self._side.start()

    @property
    def where(self) -> str:
        return self.files.where

    def _say(self, line: str) -> None:
        self.notify(line)  # looked up at each call: a caller may set ``notify`` after the start

    def _meta_snapshot(self) -> dict[str, Any]:
        return dict(self.meta, final_metrics=dict(self._final_metrics), writer=self.writer)

    def remember_metric(self, event: Metric) -> None:
        self._final_metrics[event.final_name] = event.value

    def record(self, event: Event, timestamp: float | None = None) -> None:
        """Add one event; never waits for the store, but at the finish (at most ``finish_wait`` seconds)."""
        timestamp = time.time() if timestamp is None else timestamp
        finished = event if isinstance(event, RunFinished) else None
        with self._lock:
            if self._closed:
                return
            self.events.write(dumps(event, timestamp) + "\n")
            if self.worker is not None:
                self._step_timer.observe(event, timestamp)
            if isinstance(event, Metric):
                self.remember_metric(event)
            if isinstance(event, Progress) and event.unit == "epoch":
                self._meta_due = True
            if isinstance(event, RunStarted) and is_sane_timestamp(event.time):
                self.meta["started"] = event.time
                self._meta_due = True
            if finished is not None:
                self._closed = True
                self._status = finished.status
                self.meta.update(
                    status=finished.status, finished=timestamp, summary=finished.summary, error=finished.error
                )
        if finished is not None:
            self._end(finished=True)

    def flush(self) -> None:
        """Close the open segment now (its upload follows on the writer's thread: no waiting for the store)."""
        self.events.seal_now()

    def wait_uploaded(self, timeout: float) -> bool:
        """Wait until the store has every event recorded so far and the run's record; whether it has."""
        return self.events.wait_uploaded(timeout) and self.record_uploaded.wait(timeout)

    def close(self) -> None:
        """Upload what is buffered and stop, without a finish: the run turns stale, as a killed writer's does."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._end(finished=False)

    def _log_outage(self, line: str) -> None:
        """An outage's start and end, in the run's own log: whoever reads the run later knows why it paused."""
        with self._lock:
            if not self._closed:
                self.events.write(dumps(Log(level="warning", text=line), time.time()) + "\n")

    # -- run.json and the heartbeat, on a thread of their own -----------------------------------
    def _keep_up(self) -> None:
        """The heartbeat every interval; run.json when due (an epoch), and at a beat when the metrics moved.

        So a run without epochs (a loop with ``tpudash.record``) that goes stale still lists its last metrics.
        """
        next_beat = 0.0
        metrics_written: dict[str, float] = {}
        while not self._side_stop.is_set():
            if self.events.unreachable_since is None:
                beat_due = time.monotonic() >= next_beat
                with self._lock:
                    if beat_due and self._final_metrics != metrics_written:
                        self._meta_due = True
                    meta = self._meta_snapshot() if self._meta_due else None
                    self._meta_due = False
                try:
                    if beat_due:
                        self.beat()  # before the first run.json: a reader that finds the run finds it live
                        next_beat = time.monotonic() + HEARTBEAT_INTERVAL_SECONDS
                    if meta is not None:
                        self._write_record(meta, unless_ended=True)
                        metrics_written = meta["final_metrics"]
                except Exception:  # noqa: BLE001 - the store is away: the events' writer notices and says so
                    if meta is not None:
                        self._meta_due = True
            self._side_stop.wait(TICK_SECONDS)

    def _write_record(self, meta: dict[str, Any], unless_ended: bool = False) -> None:
        """Replace run.json; one upload at a time, so an epoch's record never lands after the finish's."""
        with self._record_lock:
            if unless_ended and self._side_stop.is_set():
                return  # the run is ending: the finish writes the last record
            self.files.write(RUN_FILE, record_bytes(to_jsonable(meta)))
            self.record_uploaded.set()

    def beat(self) -> None:
        """Write this writer's heartbeat now (a chief's with its step stats: ``workers.heartbeat_payload``)."""
        with self._lock:
            payload = heartbeat_payload(self.writer, self.worker, self._step_timer, status=self._status or "running")
        self.files.write(f"{WRITERS_FOLDER}/{self.writer}.json", json.dumps(payload, sort_keys=True).encode())

    # -- the end --------------------------------------------------------------------------------
    def _end(self, finished: bool) -> None:
        """Upload the rest within ``finish_wait``, on a thread of its own so no client can hold the caller longer.

        What the store did not take by then stays in ``run_dir`` with the
        run's record, and one line says where and how to upload it.
        """
        self._side_stop.set()
        deadline = time.monotonic() + self.finish_wait
        meta = self._meta_snapshot()
        done, outcome = threading.Event(), {"complete": False}

        def upload_rest() -> None:
            try:
                outcome["complete"] = self._upload_rest(deadline, meta, finished)
            except Exception as error:  # noqa: BLE001 - the store went away at the last moment
                self.events.last_error = describe(error)
            finally:
                done.set()
                self._forget_held()

        threading.Thread(target=upload_rest, name=f"tpudash-finish-{meta['run_id']}", daemon=True).start()
        if done.wait(max(0.0, deadline - time.monotonic())) and outcome["complete"]:
            return
        self._abandoned = True
        left = self.events.keep_rest()
        try:
            self._spill.write(RUN_FILE, record_bytes(to_jsonable(meta)))
        except OSError as error:
            self.write_error = error  # neither the store nor this disk has the run's end
        self.kept_locally = self.run_dir
        self.notify(
            f"run {meta['run_id']}: {left} events could not be uploaded to {self.files.where} within "
            f"{self.finish_wait:g} s ({self.events.last_error}); kept in {self.run_dir} "
            f"(`tpudash copy {self.run_dir} {self.files.where.rsplit('/', 1)[0]}` uploads them)"
        )

    def _upload_rest(self, deadline: float, meta: dict[str, Any], finished: bool) -> bool:
        """The last segments, then run.json, then the job's files; whether the store took all.

        Closed without a finish, the run stays ``running`` in its record and
        its heartbeat is left to age: it reads as stale, as a killed writer's.
        """
        if not self.events.finish(deadline):
            return False
        self._write_record(meta)
        if finished:
            self.beat()
        upload_artifacts(self.files, self.run_dir)
        if self._abandoned:
            return False  # the caller gave up waiting and kept the run locally: that copy stays
        forget_local_dir(self.run_dir)
        return True
