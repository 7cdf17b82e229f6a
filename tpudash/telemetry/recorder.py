"""Recording telemetry with a run: samples appended to each live run's telemetry.jsonl, one observer per run.

Whoever samples while a run is live (the dashboard, ``tpudash run``,
``tpudash watch``) may record; an flock on the file makes the first of them
the only writer, so History replays each sample once beside the run's
curves. ``RecordingTelemetry`` is the command line's way to do it: it
samples on a thread for as long as one run lives under this process.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Protocol

from jobs.events import Event, RunStarted, Telemetry, dumps
from tpudash.runs.layout import TELEMETRY_FILE
from tpudash.telemetry.sampling import SamplingLoop, TelemetrySettings, telemetry_sampler


class TelemetryRecorder:
    """Appends samples to the telemetry.jsonl of each live run.

    Several observers may watch one run (the dashboard and ``tpudash watch``):
    the first to take the file's lock records, the others leave it alone, so
    a run never gets every sample twice. A run's file is closed, and its lock
    given up, once the run is no longer among the live ones.
    """

    def __init__(self) -> None:
        self._files: dict[Path, IO[bytes]] = {}
        self.write_errors: dict[Path, str] = {}

    def record(self, stamp: float, sample: Telemetry, run_dirs: Iterable[Path]) -> None:
        live = {Path(run_dir) for run_dir in run_dirs}
        for run_dir in list(self._files):
            if run_dir not in live:
                self._close(run_dir)
        line = (dumps(sample, stamp) + "\n").encode()
        for run_dir in live:
            handle = self._files.get(run_dir)
            if handle is None and run_dir.is_dir():  # a run about to start has no directory yet
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

    def _close(self, run_dir: Path) -> None:
        handle = self._files.pop(run_dir, None)
        if handle is not None:
            handle.close()  # closing gives up the lock

    @property
    def recording(self) -> list[Path]:
        """The run directories this recorder writes to."""
        return list(self._files)

    def close(self) -> None:
        for run_dir in list(self._files):
            self._close(run_dir)


class _RunWithDirectory(Protocol):
    """What a runner sink is given of its run: where it is recorded (None: not yet)."""

    @property
    def run_dir(self) -> Path | None: ...


class RecordingTelemetry:
    """While a run is live under this process (``run``, ``watch``): sample, and record the samples with the run.

    ``run_dir`` is set by the caller (``watch``), or by this object as a
    runner sink when the run starts (``run``). Nothing is sampled when
    ``--telemetry-interval`` is 0.
    """

    def __init__(self, settings: TelemetrySettings, processes: Mapping[str, int]):
        self.run_dir: Path | None = None
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
        """A runner sink: the run's directory exists once it has started; sample it at once."""
        if isinstance(event, RunStarted) and run is not None and run.run_dir is not None:
            self.run_dir = run.run_dir
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
