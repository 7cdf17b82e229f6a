"""The runs directory (local or a store): the facade the rest of the code calls to write, list, find and read runs.

``RunStore`` keeps the caches a dashboard needs to list a runs directory
every few seconds, and hands the work to one part per job:

- writing a run (create, join, end an abandoned one): ``tpudash.runs.writing``;
- reading one run's record (run.json checked, or its events): ``tpudash.runs.records``;
- judging whether a running run's writer is alive: ``tpudash.runs.judge``;
- reading a growing stream: ``tpudash.runs.segments`` and ``tpudash.runs.tail``.

Reading never trusts the files: a truncated line, a malformed run.json or an
unknown event is reported as a problem and the rest is still shown. A run
left ``running`` by a process that no longer exists is reported as
``interrupted`` (locally) or ``stale`` (in a store, where it may come back).
The file layout is ``tpudash.runs.layout``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from tpudash.runs.backends import RunFiles, runs_root
from tpudash.runs.export import export_run
from tpudash.runs.export_stream import run_csv
from tpudash.runs.heartbeat import add_problem
from tpudash.runs.judge import Listing, Verdict, WriterJudge
from tpudash.runs.layout import (
    EVENTS_FILE,
    EVENTS_STREAM,
    MAX_RUN_FILE_BYTES,
    RUN_FILE,
    RUN_ID_RULE,
    SOURCE_JOB,
    TELEMETRY_STREAM,
    is_run_id,
)
from tpudash.runs.layout import STATUS_INTERRUPTED as STATUS_INTERRUPTED
from tpudash.runs.layout import STATUS_RUNNING as STATUS_RUNNING
from tpudash.runs.layout import STATUS_STALE as STATUS_STALE
from tpudash.runs.records import RunData as RunData
from tpudash.runs.records import RunInfo as RunInfo
from tpudash.runs.records import copy_info, read_record, refresh_from_events
from tpudash.runs.records import run_id_of as run_id_of
from tpudash.runs.segments import StreamTail
from tpudash.runs.tail import read_events
from tpudash.runs.uploader import local_run_dir
from tpudash.runs.worker_recorder import JoinedRecorder
from tpudash.runs.workers import WorkerIdentity
from tpudash.runs.writing import Recorder as Recorder
from tpudash.runs.writing import RunWriter


class RunStore:
    """The runs directory (a local directory or a store URL): create runs, list them, load and export one.

    ``root`` is a local directory (a Path) or a store's URL (``gs://bucket/runs``, see
    ``tpudash.runs.location``); ``spill_root`` is where a store's writers keep what the
    store has not taken yet (``uploader.default_spill_dir`` by default).
    """

    def __init__(self, root: Path | str, *, spill_root: Path | None = None):
        self.backend = runs_root(root)
        self.root: Path | str = self.backend.runs_dir
        self.where = self.backend.where
        """The runs directory as a user reads it."""
        self.local = self.backend.local
        self.spill_root = spill_root
        self.writer = RunWriter(self.backend, spill_root, self.stream)
        self.judge = WriterJudge(self.backend)
        self._recorded: dict[str, tuple[tuple | None, RunInfo]] = {}
        """run.json as read, by run id, with the key (mtime and size, generation, ETag) it was read at."""
        self._ended: dict[str, tuple[tuple | None, RunInfo]] = {}
        """Runs judged ended: History lists the runs every second, and thousands of old ones must cost nothing."""

    def files(self, run_id: str) -> RunFiles:
        return self.backend.files(run_id)

    def location(self, run_id: str) -> str:
        """Where a run is, as a user reads it: its directory or its URL."""
        return self.files(run_id).where

    def local_dir(self, run_id: str) -> Path:
        """Where this host writes a run's files: its directory, or for a store run its local directory
        (``uploader.local_run_dir``: telemetry and TensorBoard logs there go up at the run's finish)."""
        return self.files(run_id).local_dir or local_run_dir(self.spill_root, run_id)

    def stream(self, run_id: str, stream: str = EVENTS_STREAM, *, follow: bool = False) -> StreamTail:
        """A reader of a run's events (or ``telemetry``) in either layout (``segments.StreamTail``).

        ``follow``: for a reader polled from a UI's thread (the dashboard's lane, a run view): in a
        store its requests are made on a thread of its own, so a poll never waits for the network.
        """
        return StreamTail(self.files(run_id), stream, appends=self.local, prefetch=follow and not self.local)

    def prepare(self) -> None:
        """Create the runs directory if it is local (a store's prefix needs nothing)."""
        self.backend.prepare()

    # -- writing (``tpudash.runs.writing``) ------------------------------------------------------------

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
        """A new run and its recorder (``flush_interval``: see ``RunRecorder``; a store's recorder always buffers).

        ``name``: what the user called the run; by default one made from the job and its params.
        ``worker``: the chief of a training cluster (``workers.find_worker``): run.json then says how many
        workers write the run, and the chief's heartbeat carries its step stats as every worker's does.
        The other workers ``join`` the run; one of them may have begun before the chief, so the run's
        directory may exist already, but a run.json there is another run's (FileExistsError).
        """
        return self.writer.create(
            run_id, job, params, runtime, source=source, flush_interval=flush_interval, name=name, worker=worker
        )

    def join(self, run_id: str, job: str, params: dict, runtime: dict, *, worker: WorkerIdentity) -> JoinedRecorder:
        """A non-chief worker's recorder of the run its chief creates (``worker_recorder.JoinedRecorder``).

        It never writes run.json; its events go to the stream ``worker-<index>`` and its heartbeat to
        ``writers/``, locally as in a store. ``job``, ``params`` and ``runtime`` go into its own RunStarted.
        """
        return self.writer.join(run_id, job, params, runtime, worker=worker)

    def finish_abandoned(self, run_id: str, job: str, params: dict, status: str, error: str | None) -> OSError | None:
        """End a run whose writer died (a killed engine): record RunFinished and update run.json.

        Everything the run reported stays; its final metrics are read back
        from its events. Locally RunFinished starts on a line of its own,
        after a last line the writer left cut short (that line reads as one
        event that could not be read); in a store it is a segment of its own.
        A run the writer never created is created here, so even a job that
        died before it started has a record. A run that already ended is left
        as it is. Returns the error that kept the end from being written (a
        full disk, a store away), or None; it never raises one.
        """
        return self.writer.finish_abandoned(run_id, job, params, status, error)

    # -- reading and judging ---------------------------------------------------------------------------

    def run_ids(self) -> list[str]:
        """Every run's id, by name (locally a symbolic link to a directory is listed; ``info`` says it is not read)."""
        return self.backend.run_ids()

    def record_key(self, files: RunFiles) -> tuple | None:
        """What changes when a run's record changes: run.json's (else the appended events') key."""
        return files.key(RUN_FILE) or files.key(EVENTS_FILE)

    def info(self, run: str | Path, prefetched: bytes | Exception | None = None) -> RunInfo:
        """One run's record (``run`` is its id or location), falling back to its events when run.json is unusable.

        Ended runs are read once: locally while run.json's mtime and size stay
        the same, in a store for good (only a run's writer replaces its
        run.json, and an ended run's writer is done). A running run's
        run.json is read again only when its key changes (its generation or
        ETag in a store); its writer's liveness is judged at every call.
        ``prefetched``: run.json's bytes (or the error reading them), from a
        batch read of many runs.
        """
        run_id = run_id_of(run)
        ended = self._ended_info(run_id)
        if ended is not None:
            return ended
        key = None if prefetched is not None else self.record_key(self.files(run_id))
        return self._judged(self._record(run_id, key, prefetched), self.judge.judge_one)

    def list_runs(self) -> list[RunInfo]:
        """Every run, oldest first. A run that cannot be read at all still lists, with what went wrong.

        See ``infos``: ended runs cost nothing, and in a store the running ones are judged together.
        """
        return self.infos(self.run_ids())

    def infos(self, run_ids: list[str]) -> list[RunInfo]:
        """The runs ``run_ids`` (in that order), read and judged as one scan.

        In a store, the run.json of every run not read before is fetched in
        one concurrent batch (a bucket of a thousand runs opens in about a
        second against an emulator), and ended runs are never fetched again.
        When more than ``judge.ONE_BY_ONE_RUNS`` running runs need a look,
        one recursive listing of the store gives every run.json's key and
        every heartbeat (``judge.WriterJudge.judge_listed``); a running run
        found silent keeps its verdict for a while (``judge``'s backoff), so a
        bucket of crashed runs is not asked about each of them at every scan.
        """
        listing: Listing | None = None
        fresh: set[str] = set()
        if not self.local:
            unread = [run_id for run_id in run_ids if run_id not in self._ended and run_id not in self._recorded]
            due = len(unread) + sum(self._running(run_id) and self.judge.due(run_id) for run_id in run_ids)
            # Listed before anything is read: a run.json read after the listing is at least as new as its key.
            listing = self.judge.listing(due)
            if listing is None:
                fresh = self._read_new(unread)
            else:
                self._read_listed(run_ids, listing)
        known: dict[str, RunInfo | Exception] = {}
        for run_id in run_ids:
            try:
                known[run_id] = self._ended_info(run_id) or self._scanned_record(run_id, listing, fresh)
            except Exception as error:  # noqa: BLE001 - one bad run must never stop a scan of the others
                known[run_id] = error
        verdicts: dict[str, Verdict] = {}
        if listing is not None:
            running = [info for run_id, info in known.items() if isinstance(info, RunInfo) and self._running(run_id)]
            verdicts = self.judge.judge_listed(running, listing)
        infos = []
        for run_id in run_ids:
            info = known[run_id]
            try:
                if isinstance(info, Exception):
                    raise info
                if run_id in self._recorded and self._recorded[run_id][1] is info:
                    info = self._judged(info, lambda judged: self._scan_verdict(judged, verdicts))
                infos.append(info)
            except Exception as error:  # noqa: BLE001 - one bad run must never stop a scan of the others
                infos.append(
                    RunInfo(
                        run_id=run_id,
                        path=self.location(run_id),
                        problems=[f"cannot read: {type(error).__name__}: {error}"],
                    )
                )
        return infos

    def _running(self, run_id: str) -> bool:
        recorded = self._recorded.get(run_id)
        return recorded is not None and recorded[1].status == STATUS_RUNNING

    def _read_new(self, unread: list[str]) -> set[str]:
        """The run.json of the runs not read before, in one batch (their key unknown yet); those runs."""
        for run_id, data in self.backend.read_many(unread, RUN_FILE, MAX_RUN_FILE_BYTES).items():
            with contextlib.suppress(Exception):  # said when the run is looked at again, one by one
                self._record(run_id, None, data)
        return set(unread)

    def _read_listed(self, run_ids: list[str], listing: Listing) -> None:
        """The run.json of each run not read before or whose key in ``listing`` changed, in one batch, with that key."""
        changed = []
        for run_id in run_ids:
            recorded = self._recorded.get(run_id)
            if run_id not in self._ended and (recorded is None or recorded[0] != _listed_key(listing, run_id)):
                changed.append(run_id)
        for run_id, data in self.backend.read_many(changed, RUN_FILE, MAX_RUN_FILE_BYTES).items():
            with contextlib.suppress(Exception):  # said when the run is looked at again, one by one
                self._record(run_id, _listed_key(listing, run_id), data)

    def _scanned_record(self, run_id: str, listing: Listing | None, fresh: set[str]) -> RunInfo:
        """A run's record in a scan: read again only when its key says so; a silent run's is not even asked."""
        recorded = self._recorded.get(run_id)
        if recorded is not None and not self.local:
            if listing is not None or run_id in fresh or not self.judge.due(run_id):
                return recorded[1]  # its key settled by the listing, just read, or silent: asked again later
        return self._record(run_id, self.record_key(self.files(run_id)), None)

    def _scan_verdict(self, info: RunInfo, verdicts: dict[str, Verdict]) -> Verdict:
        verdict = verdicts.get(info.run_id)
        if verdict is None and not self.local and not self.judge.due(info.run_id):
            verdict = self.judge.last(info.run_id)
        return verdict or self.judge.judge_one(info)

    def _ended_info(self, run_id: str) -> RunInfo | None:
        """A copy of the run's record if it ended (locally: and run.json has not changed since)."""
        ended = self._ended.get(run_id)
        if ended is not None and (not self.local or ended[0] == self.record_key(self.files(run_id))):
            return copy_info(ended[1])
        return None

    def _record(self, run_id: str, key: tuple | None, prefetched: bytes | Exception | None) -> RunInfo:
        """The run's record as last read, read again when ``key`` changed (or is unknown)."""
        recorded = self._recorded.get(run_id)
        if recorded is None or key is None or recorded[0] != key:
            info = read_record(run_id, self.files(run_id), prefetched, self.stream)
            info.record_key = key
            recorded = (key, info)
            self._recorded[run_id] = recorded
        return recorded[1]

    def _judged(self, record: RunInfo, verdict_of: Callable[[RunInfo], Verdict]) -> RunInfo:
        """A run recorded as running, judged by its writer: live, interrupted (its writer is gone) or stale."""
        info = copy_info(record)
        if info.status == STATUS_RUNNING:
            verdict = verdict_of(info)
            for line in verdict.problems:
                add_problem(info.problems, line)
            if verdict.alive is False:
                if self.local:
                    info.status = STATUS_INTERRUPTED
                    refresh_from_events(info, self.stream(info.run_id))
                else:
                    # Its writers stopped beating: dead, or cut off from the store (then it comes back).
                    info.status = STATUS_STALE
            info.live = bool(verdict.alive)
        # A stale run may come back (its writer was cut off from the store): it is judged again.
        if info.status not in (STATUS_RUNNING, STATUS_STALE) and (info.record_key is not None or not self.local):
            self._ended[info.run_id] = (info.record_key, info)
            self._recorded.pop(info.run_id, None)
            self.judge.forget(info.run_id)
        return copy_info(info)

    def find(self, run_id: str) -> Path | str:
        """The location of ``run_id`` (a unique prefix is enough): a directory, or a URL; KeyError if none."""
        if not isinstance(run_id, str) or not is_run_id(run_id):
            raise KeyError(f"{run_id!r} is not a run id: {RUN_ID_RULE}")
        exact = self.files(run_id)
        if exact.local_dir is not None and exact.exists():
            return exact.local_dir
        run_ids = self.run_ids()
        matches = [run_id] if run_id in run_ids else [name for name in run_ids if name.startswith(run_id)]
        if len(matches) == 1:
            files = self.files(matches[0])
            if files.local_dir is not None:
                if files.local_dir.is_symlink():
                    raise KeyError(f"run {matches[0]}: a symbolic link to a directory, not followed")
                return files.local_dir
            return files.where
        if not matches:
            raise KeyError(f"no run {run_id!r} in {self.where}")
        raise KeyError(f"run id {run_id!r} is ambiguous: {', '.join(matches[:5])}")

    def load(self, run_id: str) -> RunData:
        found = run_id_of(self.find(run_id))
        info = self.info(found)
        events, problems = read_events(self.stream(found))
        info.problems.extend(problems)
        telemetry, problems = read_events(self.stream(found, TELEMETRY_STREAM))
        info.problems.extend(problems)
        return RunData(info=info, events=events, problems=info.problems, telemetry=telemetry)

    def export(self, run_id: str, fmt: str = "csv") -> str:
        """A run's metrics as CSV (one row per metric point) or JSON, with its telemetry (see ``tpudash.runs.export``)."""
        if fmt == "csv":  # written as the run is read: its events are never all held (``export_stream``)
            return run_csv(self, run_id)
        data = self.load(run_id)
        return export_run(data.info.to_dict(), data.metrics(), data.telemetry, fmt)


def _listed_key(listing: Listing, run_id: str) -> tuple | None:
    """run.json's key as the store's listing gave it (None: the run has no run.json)."""
    listed = listing.get(run_id, {}).get(RUN_FILE)
    return None if listed is None else listed.key
