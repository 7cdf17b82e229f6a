"""Follow any run on disk as it grows: the dashboard's view of a run and ``tpudash watch``.

The run directory is the bus. A tpudash job in the engine, the user's
``fit`` with ``TpudashCallback``, a loop under ``tpudash.record`` and
``tpudash run`` in another terminal all append to events.jsonl; a
``RunFollower`` reads what was added since its last ``poll`` into a
``RunModel``. While the run has not finished it checks, once a second,
that the process writing it still exists; when it is gone the run ends as
``interrupted``, with every event it wrote kept. A run written by a
training cluster also has its workers' heartbeats read, every
``WORKERS_READ_SECONDS`` (``RunFollower.workers_update``). While a run's
store does not answer, ``store_outage`` says since when (and how many of its
events this host holds meanwhile), its writer is not judged gone for that,
and ``StoreAway`` gives ``tpudash watch`` its lines and a clock that stops.
Textual-free, and it imports no TensorFlow.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from jobs.events import Event
from tpudash.runs.backends import RunFiles
from tpudash.runs.layout import (
    RUN_FILE,
    SOURCE_CALLBACK,
    SOURCE_JOB,
    SOURCE_RECORD,
    STATUS_INTERRUPTED,
    STATUS_RUNNING,
    STATUS_STALE,
    TELEMETRY_STREAM,
)
from tpudash.runs.liveness import HEARTBEAT_INTERVAL_SECONDS, STALE_AFTER_INTERVALS
from tpudash.runs.model import RunModel
from tpudash.runs.store import RunInfo, RunStore, run_id_of
from tpudash.runs.storeclient import Outage, outage, spilled_events
from tpudash.runs.workers import WorkerStatus, read_workers

WRITER_CHECK_SECONDS = 1.0
# In a store a writer's liveness is its heartbeat, which changes this often: looking more often costs requests.
STORE_WRITER_CHECK_SECONDS = HEARTBEAT_INTERVAL_SECONDS
STORE_SCAN_SECONDS = 5.0
"""How often the runs of a store are listed again for new and live runs (a local directory: at every scan)."""
CATCH_UP_BYTES = 1 << 20
"""What ``catch_up`` reads at a time: opening a long run holds this much of its file, not all of it."""
# How often ``tpudash watch`` reads the file: what a person following a run perceives as at once.
POLL_SECONDS = 0.1
WORKERS_READ_SECONDS = 5.0
"""How often a run's worker heartbeats are read: as often as they are written, and in a store each read
is a listing and a request per worker."""
STORE_BACK_GRACE_SECONDS = STALE_AFTER_INTERVALS * HEARTBEAT_INTERVAL_SECONDS
"""After its store answers again, a writer's heartbeat is not judged for this long: it aged while the store was
away, and the writer beats again only once it has uploaded what it held."""


def newest_live_run(store: RunStore) -> RunInfo | None:
    """The most recently started run whose writer is alive on this host, if any."""
    live = [info for info in store.list_runs() if info.live]
    return max(live, key=lambda info: (info.started or 0.0, info.run_id), default=None)


class RunFollower:
    """One run's events read incrementally into a model; see the module docstring."""

    def __init__(self, store: RunStore, run_id: str, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.run_dir: Path | str = store.find(run_id)
        """Where the run is: its directory, or its URL in a store."""
        self.info: RunInfo = store.info(self.run_dir)
        info = self.info
        self.model = RunModel(run_id=info.run_id, job=info.job, params=info.params, status=STATUS_RUNNING)
        self.model.started = info.started
        self.model.problems = list(info.problems)
        self.tail = store.stream(run_id_of(self.run_dir), follow=True)
        self.telemetry_tail = store.stream(run_id_of(self.run_dir), TELEMETRY_STREAM, follow=True)
        """What observers sampled beside the run; read into the model, not returned by ``poll``."""
        self._writer_check_seconds = WRITER_CHECK_SECONDS if store.local else STORE_WRITER_CHECK_SECONDS
        self._writer_answer: bool | None = None
        self._writer_asking: threading.Thread | None = None
        self._clock = clock
        self._writer_checked = clock()
        self._store_was_away = False
        self.ended = False
        """True once the run finished (its run_finished was read) or its writer is gone."""
        # Only a run whose chief said it has workers is asked for their heartbeats: the others have none.
        self.workers: WorkersWatch | None = None
        if info.workers:
            files = info.files or store.files(run_id_of(self.run_dir))
            self.workers = WorkersWatch(files, local=store.local, clock=clock)

    @property
    def live(self) -> bool:
        """Still growing: not ended (a run on another host counts as live until it finishes)."""
        return not self.ended

    def poll(self, max_bytes: int | None = None) -> list[tuple[float | None, Event]]:
        """Read what the run gained since the last poll into ``model``; the new events.

        ``max_bytes``: read about that much at most (see ``catch_up``).
        """
        if self.ended:
            return []
        events = self.tail.read_new(max_bytes=max_bytes)
        if events:
            self.model.apply_all(events)
            if not self.store.local:
                # A segment just came: its writer was alive seconds ago, no need to ask its heartbeat now.
                self._writer_checked = self._clock()
        self.model.apply_all(self.telemetry_tail.read_new(max_bytes=max_bytes))
        if self.tail.finished:
            self._end()
        elif not self.tail.at_end:
            pass  # more is written already: the next poll reads on
        elif self.info.status != STATUS_RUNNING or self._writer_gone():
            # Its last words may have landed after the read above.
            events += self._read_rest()
            if not self.tail.finished:
                self._unfinished()
            self._end()
        return events

    def workers_update(self) -> list[WorkerStatus] | None:
        """The run's workers when a read of their heartbeats is due and has come back; else None.

        None also for a run with no workers, and once the run has ended (its
        finish says how). See ``WorkersWatch``.
        """
        if self.workers is None or self.ended:
            return None
        return self.workers.update()

    def catch_up(self) -> None:
        """Read everything written so far into ``model``, CATCH_UP_BYTES at a time.

        A run of a million events opens with memory bounded by the model's
        caps (its series are decimated, its log is the last lines), not by
        the size of its file: no list of all its events is ever made.
        """
        with self.tail.here(), self.telemetry_tail.here():  # on the caller's thread, which waits for it
            while not self.ended:
                self.poll(max_bytes=CATCH_UP_BYTES)
                if self.tail.at_end and self.telemetry_tail.at_end:
                    return

    def store_outage(self) -> Outage | None:
        """The run's store not answering now: since when, and the events held on this host meanwhile (a writer
        here spills them into the run's local directory); None for a local run or a store that answers."""
        if self.store.local:
            return None
        away = outage(str(self.run_dir))
        if away is None or away.held:
            return away
        return Outage(away.store, away.since, away.reason, spilled_events(self.store.local_dir(self.info.run_id)))

    def _writer_gone(self) -> bool:
        if self._clock() - self._writer_checked < self._writer_check_seconds:
            return False
        self._writer_checked = self._clock()
        if self.store.local:
            return self.info.writer_alive() is False
        if self.store_outage() is not None:
            self._store_was_away, self._writer_answer = True, None
            return False  # a store that does not answer says nothing of the writer
        if self._store_was_away:
            # Its heartbeat aged meanwhile: judge it again once it had time to beat.
            self._store_was_away = False
            self._writer_checked = self._clock() + STORE_BACK_GRACE_SECONDS - self._writer_check_seconds
            return False
        # In a store that is requests: asked on a thread, and its answer used from the next look on.
        if self._writer_asking is None or not self._writer_asking.is_alive():
            self._writer_asking = threading.Thread(target=self._ask_writer, daemon=True)
            self._writer_asking.start()
        return self._writer_answer is False

    def _ask_writer(self) -> None:
        self._writer_answer = self.info.writer_alive()

    def _read_rest(self) -> list[tuple[float | None, Event]]:
        try:
            events = self.tail.read_new(final=True)
        except OSError:
            return []
        self.model.apply_all(events)
        return events

    def _unfinished(self) -> None:
        """No run_finished in the events: the record's status wins (interrupted when the writer died, stale in a store)."""
        model, info = self.model, self.info
        if info.status == STATUS_RUNNING:
            model.status = STATUS_INTERRUPTED if self.store.local else STATUS_STALE
        else:
            model.status = info.status
        model.error = model.error or info.error
        model.summary = model.summary or dict(info.summary)
        model.finished = model.finished or info.finished or time.time()
        model.version += 1

    def _end(self) -> None:
        self.ended = True
        model, info = self.model, self.info
        if info.job != "?":
            model.job = info.job
        model.started = model.started or info.started
        model.problems = list(info.problems) + self.tail.report()
        try:
            while True:
                model.apply_all(self.telemetry_tail.read_new(final=True, max_bytes=CATCH_UP_BYTES))
                if self.telemetry_tail.at_end:
                    break
        except OSError:
            pass  # no telemetry was recorded: nothing to add
        model.problems += self.telemetry_tail.report()
        self.tail.close()
        self.telemetry_tail.close()


class StoreAway:
    """``tpudash watch``'s view of its run's store: a line when it stops answering and when it answers again,
    and a clock (for the bars' elapsed times) that stands still meanwhile, at the moment it stopped."""

    def __init__(
        self,
        follower: RunFollower,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.follower = follower
        self._clock = clock
        self._wall = wall
        self.away: Outage | None = None
        self._stopped_at: float | None = None

    def update(self) -> str | None:
        """What to tell the user now that the store stopped or came back; None when nothing changed."""
        now = self.follower.store_outage()
        if now is not None and self.away is None:
            self.away = now
            self._stopped_at = self._clock() - max(0.0, self._wall() - now.since)
            return f"{now.line()} ({now.cause}): shown as of then; the run may have gone on"
        if now is None and self.away is not None:
            gone = max(0.0, self._wall() - self.away.since)
            self.away = self._stopped_at = None
            return f"the store answers again after {gone:.0f} s; reading what the run wrote meanwhile"
        return None

    def time(self) -> float:
        """The clock the bars measure with: the real one, or the moment the store stopped answering."""
        return self._clock() if self._stopped_at is None else self._stopped_at


class WorkersWatch:
    """A run's workers read from their heartbeats (``workers.read_workers``) at most every ``interval``.

    The first read is at once. On this disk a read is a directory listing and
    a few small files, done in ``update``; in a store it is requests, so it
    runs on a thread and its answer comes out of the next ``update`` that finds
    it done: the events keep coming meanwhile. A store that cannot be asked is
    asked again at the next interval; the heartbeats skipped as malformed are
    named in ``problems``.
    """

    def __init__(
        self,
        files: RunFiles,
        *,
        local: bool,
        clock: Callable[[], float] = time.monotonic,
        interval: float = WORKERS_READ_SECONDS,
    ) -> None:
        self.files = files
        self.problems: list[str] = []
        self._local = local
        self._clock = clock
        self._interval = interval
        self._next = clock()
        self._reading: threading.Thread | None = None
        self._answer: list[WorkerStatus] | None = None

    def update(self) -> list[WorkerStatus] | None:
        """The workers, when a read is due (on this disk) or has come back (in a store); else None."""
        if self._reading is not None:
            if self._reading.is_alive():
                return None
            self._reading = None
            answer, self._answer = self._answer, None
            return answer
        if self._clock() < self._next:
            return None
        self._next = self._clock() + self._interval
        if self._local:
            return self._read()
        self._reading = threading.Thread(target=self._read_for_later, daemon=True, name="tpudash-read-workers")
        self._reading.start()
        return None

    def _read(self) -> list[WorkerStatus] | None:
        problems: list[str] = []
        try:
            statuses = read_workers(self.files, problems=problems)
        except Exception:  # noqa: BLE001 - a store away or a run removed: asked again at the next interval
            return None
        self.problems = problems
        return statuses

    def _read_for_later(self) -> None:
        self._answer = self._read()


# Who wrote a run, as the user would say it.
SOURCE_WORDS = {
    SOURCE_CALLBACK: "model.fit with TpudashCallback",
    SOURCE_RECORD: "a loop with tpudash.record",
    SOURCE_JOB: "a tpudash job",
}


@dataclass
class RunsScan:
    """What one look at the runs directory found."""

    changed: bool
    """A run appeared or vanished, or a live run's record changed (an epoch, its end, its writer's death)."""
    appeared_live: list[RunInfo] = field(default_factory=list)
    """Runs seen live for the first time (already live at the first scan included)."""
    live: list[RunInfo] = field(default_factory=list)
    """Every live run, newest first."""


class RunsDirectoryWatch:
    """Notices new runs and changes of live ones, cheaply enough to look every second.

    Only new run directories and the runs that were live are read again
    (``RunStore.infos`` keeps ended runs, and judges a store's runs together),
    so a directory of thousands of old runs costs one ``scandir`` a look.
    """

    def __init__(self, store: RunStore, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self._clock = clock
        self._known: set[str] = set()
        self._live: dict[str, tuple] = {}
        self._seen_live: set[str] = set()
        self._unsettled: set[str] = set()
        self._interval = 0.0 if store.local else STORE_SCAN_SECONDS
        self._next_scan = 0.0
        self._last = RunsScan(changed=False)

    def scan(self) -> RunsScan:
        if self._clock() < self._next_scan:
            return RunsScan(changed=False, live=list(self._last.live))
        self._next_scan = self._clock() + self._interval
        names = set(self.store.run_ids())
        appeared, vanished = names - self._known, self._known - names
        self._known = names
        changed = bool(appeared or vanished)
        live: dict[str, tuple] = {}
        result = RunsScan(changed=False)
        # One scan of the runs to look at: in a store they are judged together (``RunStore.infos``).
        for info in self.store.infos(sorted(appeared | ((set(self._live) | self._unsettled) & names))):
            name = info.run_id
            files = self.store.files(name)
            # Caught between its directory and its run.json: look again next time.
            if info.problems and files.key(RUN_FILE) is None:
                self._unsettled.add(name)
            else:
                self._unsettled.discard(name)
            if info.live:
                result.live.append(info)
                key = info.record_key if info.record_key is not None else self.store.record_key(files)
                live[name] = (info.status, key)
                if name not in self._seen_live:
                    self._seen_live.add(name)
                    result.appeared_live.append(info)
        changed = changed or live != {name: key for name, key in self._live.items() if name in names}
        self._live = live
        result.changed = changed
        result.live.sort(key=lambda info: (info.started or 0.0, info.run_id), reverse=True)
        self._last = result
        return result
