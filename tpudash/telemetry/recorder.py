"""Recording telemetry with a run: samples appended to each live run's telemetry.jsonl, one observer per run.

Whoever samples while a run is live (the dashboard, ``tpudash run``,
``tpudash watch``) may record; an flock on the file makes the first of them
the only writer, so History replays each sample once beside the run's
curves. A run in a store (a ``StoreRun`` target) gets its samples as
segments of its ``telemetry`` stream (``tpudash.runs.uploader``), written
only by the session that runs it (no lock spans hosts). ``RecordingTelemetry``
is the command line's way to do it: it samples on a thread for as long as
one run lives under this process.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from jobs.events import Event, RunStarted, Telemetry, dumps
from tpudash.runs.backends import LocalRunFiles
from tpudash.runs.layout import TELEMETRY_FILE, TELEMETRY_STREAM
from tpudash.runs.store import RunStore
from tpudash.runs.uploader import SegmentWriter
from tpudash.telemetry.sampling import SamplingLoop, TelemetrySettings, telemetry_sampler

# How long closing a run's telemetry in a store waits for its last segment (the rest stays on this host's disk).
CLOSE_WAIT_SECONDS = 2.0


@dataclass(frozen=True)
class StoreRun:
    """A run in a store, as a telemetry target: its samples go up as segments of its ``telemetry`` stream."""

    store: RunStore
    run_id: str


class StoreSamples:
    """A run's telemetry segments, with a file's face (``write`` bytes, ``flush``, ``close``) for the recorder."""

    def __init__(self, target: StoreRun) -> None:
        store, run_id = target.store, target.run_id
        spill = LocalRunFiles(store.local_dir(run_id))
        self.writer = SegmentWriter(store.files(run_id), spill, stream=TELEMETRY_STREAM, notify=lambda line: None)

    def write(self, data: bytes) -> None:
        self.writer.write(data.decode("utf-8"))

    def flush(self) -> None:
        """Segments close on the writer's own schedule."""

    def close(self) -> None:
        if not self.writer.finish(time.monotonic() + CLOSE_WAIT_SECONDS):
            self.writer.keep_rest()  # on this host's disk, beside the run's own leftovers


Target = Path | StoreRun


def target_of(store: RunStore, run_id: str) -> Target:
    """Where a run's samples go: its directory, or for a run in a store its own ``telemetry`` segments.

    In a store only the session that runs a run records it: no lock spans
    hosts to keep each sample once.
    """
    return store.local_dir(run_id) if store.local else StoreRun(store, run_id)


class TelemetryRecorder:
    """Appends samples to the telemetry.jsonl of each live run.

    Several observers may watch one run (the dashboard and ``tpudash watch``):
    the first to take the file's lock records, the others leave it alone, so
    a run never gets every sample twice. A run's file is closed, and its lock
    given up, once the run is no longer among the live ones.
    """

    def __init__(self) -> None:
        self._files: dict[Target, IO[bytes] | StoreSamples] = {}
        self.write_errors: dict[Target, str] = {}

    def record(self, stamp: float, sample: Telemetry, run_dirs: Iterable[Target]) -> None:
        """Add ``sample`` to each target: a local run directory, or a ``StoreRun``."""
        live = {run_dir if isinstance(run_dir, StoreRun) else Path(run_dir) for run_dir in run_dirs}
        for run_dir in list(self._files):
            if run_dir not in live:
                self._close(run_dir)
        line = (dumps(sample, stamp) + "\n").encode()
        for run_dir in live:
            handle = self._files.get(run_dir)
            if handle is None and isinstance(run_dir, StoreRun):
                handle = self._files[run_dir] = StoreSamples(run_dir)
            elif handle is None and isinstance(run_dir, Path) and run_dir.is_dir():  # a run about to start has none
                # Tried at every sample: the observer holding the lock may go.
                handle = self._open(run_dir)
                if handle is not None:
                    self._files[run_dir] = handle
            if handle is None:
                continue
            try:
                handle.write(line)
                handle.flush()
            except OSError as error:
                self.write_errors[run_dir] = error.strerror or str(error)
                self._close(run_dir)

    def _open(self, run_dir: Path) -> IO[bytes] | None:
        try:
            handle = open(run_dir / TELEMETRY_FILE, "ab")  # noqa: SIM115 - kept open while the run lives
        except OSError as error:
            self.write_errors[run_dir] = error.strerror or str(error)
            return None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()  # another observer records this run
            return None
        return handle

    def _close(self, run_dir: Target) -> None:
        handle = self._files.pop(run_dir, None)
        if handle is not None:
            handle.close()  # closing gives up the lock

    @property
    def recording(self) -> list[Target]:
        """The run directories this recorder writes to."""
        return list(self._files)

    def close(self) -> None:
        for run_dir in list(self._files):
            self._close(run_dir)


class _RunWithDirectory(Protocol):
    """What a runner sink is given of its run: its id, and where it is recorded (None: not yet)."""

    @property
    def run_id(self) -> str: ...

    @property
    def run_dir(self) -> Path | None: ...


class RecordingTelemetry:
    """While a run is live under this process (``run``, ``watch``): sample, and record the samples with the run.

    ``run_dir`` is set by the caller (``watch``), or by this object as a
    runner sink when the run starts (``run``; ``store``: the runs directory
    it is recorded in). Nothing is sampled when ``--telemetry-interval`` is 0.
    """

    def __init__(self, settings: TelemetrySettings, processes: Mapping[str, int], store: RunStore | None = None):
        self.store = store
        self.run_dir: Target | None = None
        self.recorder = TelemetryRecorder()
        self.loop: SamplingLoop | None = None
        if settings.telemetry_interval:
            self.loop = SamplingLoop(
                telemetry_sampler(settings), settings.telemetry_interval, self._record, processes=lambda: processes
            )

    def _record(self, stamp: float, sample: Telemetry) -> None:
        if self.run_dir is not None:
            self.recorder.record(stamp, sample, [self.run_dir])

    def __call__(self, run: _RunWithDirectory | None, event: Event, timestamp: float | None = None) -> None:
        """A runner sink: the run's directory exists once it has started; sample it at once.

        A run in a store (``store``) gets its samples as segments of its own.
        """
        if isinstance(event, RunStarted) and run is not None and run.run_dir is not None:
            self.run_dir = target_of(self.store, run.run_id) if self.store is not None else run.run_dir
            if self.loop is not None:
                self.loop.wake()

    def __enter__(self) -> RecordingTelemetry:
        if self.loop is not None:
            self.loop.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.loop is not None:
            self.loop.stop()
        self.recorder.close()
