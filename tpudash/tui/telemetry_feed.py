"""The dashboard's telemetry thread: sample until the app ends, record into live runs, hand each sample on.

``TelemetryFeed`` runs a ``tpudash.telemetry.sampling.SamplingLoop`` on a thread
of its own (not a Textual worker: it runs as long as the app, and
``workers.wait_for_complete()``, how callers wait for a job's worker, would
otherwise never return). Every sample is appended to the telemetry.jsonl of
each run live now (``aim``) and handed to ``deliver`` on the sampling thread.
Textual-free.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # telemetry loads when sampling starts, after the first frame
    from tpudash.config import Settings
    from tpudash.telemetry.recorder import Target
    from tpudash.telemetry.sampling import SamplingLoop, TelemetrySampler


class TelemetryFeed:
    """One sampling thread for the app's life; ``aim`` says which runs record it and whose memory it reads."""

    def __init__(
        self,
        settings: Settings,
        deliver: Callable[[float, Any], None],
        make_sampler: Callable[[Settings], TelemetrySampler] | None = None,
    ):
        """``deliver(time, sample)`` runs on the sampling thread; ``make_sampler`` replaces
        ``tpudash.telemetry.sampling.telemetry_sampler``."""
        self.settings = settings
        self._deliver = deliver
        self._make_sampler = make_sampler
        self.loop: SamplingLoop | None = None
        """The loop (None until the thread has made it)."""
        self._stopped = False
        self.targets: tuple[tuple[Target, ...], dict[str, int]] = ((), {})
        """(the live runs' directories that get each sample, {label: pid} whose memory each sample includes)."""

    def aim(self, run_dirs: list[Target], processes: dict[str, int]) -> None:
        # One tuple, replaced whole: the sampling thread reads it without a lock.
        self.targets = (tuple(dict.fromkeys(run_dirs)), processes)

    def start(self) -> threading.Thread:
        """Start sampling on a daemon thread (the PCI scan and psutil's first reading happen there)."""
        from tpudash.telemetry.recorder import TelemetryRecorder
        from tpudash.telemetry.sampling import SamplingLoop, telemetry_sampler

        make_sampler = self._make_sampler or telemetry_sampler
        recorder = TelemetryRecorder()

        def on_sample(stamp: float, sample: Any) -> None:
            run_dirs, _ = self.targets
            recorder.record(stamp, sample, run_dirs)
            self._deliver(stamp, sample)

        def sample() -> None:
            self.loop = loop = SamplingLoop(
                make_sampler(self.settings),
                self.settings.telemetry_interval,
                on_sample,
                processes=lambda: self.targets[1],
            )
            try:
                if not self._stopped:  # else stop may have come and gone before the loop existed
                    loop.run()
            finally:
                recorder.close()

        thread = threading.Thread(target=sample, name="tpudash-telemetry", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stopped = True
        if self.loop is not None:
            self.loop.stop()

    @property
    def history(self) -> list[Any]:
        """The samples kept so far, oldest first: (time, Telemetry)."""
        # deque.copy is one C call: atomic against the sampling thread's appends.
        return list(self.loop.sampler.history.copy()) if self.loop is not None else []
