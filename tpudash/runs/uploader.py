"""Writing a run into an object store without ever making training wait for the network.

``SegmentWriter`` takes a run's event lines into memory. Its sealing thread
closes a segment every ``seal_seconds`` (or ``SEGMENT_BYTES``), named before
its first upload (``segments``); its uploading thread puts the closed
segments into the store in order, retrying a failure with backoff
(``RETRY_SECONDS`` doubling to ``MAX_RETRY_SECONDS``). The two are apart so
that a store that hangs (a client retrying inside one call: gcsfs tries six
times over half a minute) holds up only the uploads: segments go on being
closed, and once the oldest has waited ``STALL_SECONDS``, or an upload has
failed, the store counts as unreachable and every closed segment is also
written to the run's local directory, laid out as a run, so a process that
dies during an outage leaves its events on disk; past ``MAX_MEMORY_BYTES``
segments go to disk too. When the store answers again the segments go up in
order, each once, and the run's own log says when the store went away and
came back.

``StoreRecorder`` is ``recorder.RunRecorder`` for a store: the events'
segments, run.json replaced whole at the start, at epochs and at the finish,
and the writer's heartbeat (``writers/<writer>.json``, every
``liveness.HEARTBEAT_INTERVAL_SECONDS``): in a store the heartbeat is how any
reader, on any host, tells a live writer from a stale one. The finish waits
at most ``finish_wait`` seconds for the store, whatever its client does;
what is left stays in the local directory, and one line on stderr says where
and how to upload it later (``tpudash copy``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from jobs.events import Event, Log, Metric, Progress, RunFinished, RunStarted, dumps, is_sane_timestamp, to_jsonable
from tpudash.runs.backends import LocalRunFiles, RunFiles
from tpudash.runs.layout import EVENTS_STREAM, RUN_FILE, TELEMETRY_STREAM, record_bytes
from tpudash.runs.liveness import HEARTBEAT_INTERVAL_SECONDS, WRITERS_FOLDER
from tpudash.runs.segments import new_writer_id, segment_name
from tpudash.runs.storeclient import held_by
from tpudash.runs.workers import StepTimer, WorkerIdentity, heartbeat_payload, is_worker_stream

SEAL_SECONDS = 2.0
"""A reader following a run in a store is at most this (plus its listing interval) behind the writer."""
SEGMENT_BYTES = 256 << 10
MAX_MEMORY_BYTES = 32 << 20
STALL_SECONDS = 10.0
"""A closed segment not in the store after this long: the store counts as unreachable (its client may still be retrying)."""
RETRY_SECONDS = 0.5
MAX_RETRY_SECONDS = 30.0
FINISH_WAIT_SECONDS = 10.0
TICK_SECONDS = 0.25
# What in a run's local directory is the writers' own (spilled segments, the record), not the job's files
# (TensorBoard logs): the telemetry's segments are its writer's (``tpudash.telemetry.recorder``), and
# the ``worker-<index>`` streams other workers on this host spilled (``tpudash.runs.worker_recorder``).
SPILLED = (EVENTS_STREAM, TELEMETRY_STREAM, RUN_FILE, WRITERS_FOLDER)


def is_spilled(relative: str) -> bool:
    """Whether a file of a run's local directory is a writer's own (a spilled segment, the record), not the job's."""
    first = relative.split("/")[0]
    return first in SPILLED or is_worker_stream(first)


def default_spill_dir(environ: dict[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/tpudash/unsent``: runs (or parts of runs) a store did not take yet, laid out as runs."""
    environ = dict(os.environ) if environ is None else environ
    cache_home = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "tpudash" / "unsent"


def local_run_dir(spill_root: Path | None, run_id: str) -> Path:
    """A store run's directory on this host: its spill, and the files its job and observers write locally."""
    return (spill_root or default_spill_dir()) / run_id


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
        while self._queue:
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
        self._retry_delay = RETRY_SECONDS
        self._forget_spilled(relative)
        if outage_over:
            self._came_back()  # before waiters hear the queue is empty: its log line is then in the run
        with self._lock:
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
        self._upload_artifacts()
        if self._abandoned:
            return False  # the caller gave up waiting and kept the run locally: that copy stays
        self._forget_local_dir()
        return True

    def _upload_artifacts(self) -> None:
        """The job's own files in ``run_dir`` (TensorBoard logs, telemetry) into the run.

        Each is removed locally once it is in the store, so what stays is what still has to go.
        """
        for path in sorted(self.run_dir.rglob("*")):
            relative = path.relative_to(self.run_dir).as_posix()
            if not path.is_file() or path.is_symlink() or is_spilled(relative):
                continue
            self.files.write(relative, path.read_bytes())
            path.unlink(missing_ok=True)

    def _forget_local_dir(self) -> None:
        """The store has it all: the run's local directory goes (empty folders first)."""
        for folder in sorted((path for path in self.run_dir.rglob("*") if path.is_dir()), reverse=True):
            try:
                folder.rmdir()
            except OSError:
                pass
        try:
            self.run_dir.rmdir()
        except OSError:
            pass
