"""Sampling telemetry: one ``jobs.events.Telemetry`` sample of every source, on request or on a schedule.

``TelemetrySampler`` reads the sources (``tpudash.telemetry.sources``: the
TPU through libtpu's metrics service, the host through psutil; and, where
libtpu's SDK has chips to describe, ``tpudash.telemetry.tensorcore``) into
one sample, saying per source why it gave nothing (``unavailable``), and
keeps a bounded history for the Devices sparklines. ``SamplingLoop`` takes
a sample every interval on a thread and hands it on (to the UI, to
``tpudash.telemetry.recorder``). Loading this module imports neither
TensorFlow nor libtpu (libtpu's in-process SDK can abort a process when its
version does not match).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from jobs.events import Telemetry
from tpudash.telemetry.sources import DEFAULT_TPU_METRICS_ADDRESS, HostMetrics, TpuMetricsClient
from tpudash.telemetry.tensorcore import TensorCoreProbe, add_tensorcore_utilisation, libtpu_installed

# Fifteen minutes at the default rate: what the Devices sparklines and the
# idle-accelerator hint look back over, in bounded memory.
HISTORY_SAMPLES = 900


class TelemetrySettings(Protocol):
    """What sampling needs of ``tpudash.config.Settings`` (named here so telemetry does not import config)."""

    @property
    def tpu_metrics(self) -> str: ...

    @property
    def telemetry_interval(self) -> float: ...


class TelemetrySampler:
    """Takes one ``Telemetry`` sample of both sources on request, and keeps a bounded history."""

    def __init__(
        self,
        tpu_address: str = DEFAULT_TPU_METRICS_ADDRESS,
        *,
        chips_on_host: int | None = None,
        history: int = HISTORY_SAMPLES,
        clock: Callable[[], float] = time.time,
        tpu: TpuMetricsClient | None = None,
        tensorcore: TensorCoreProbe | None = None,
    ):
        """``tensorcore``: where TensorCore utilisation comes from (None: not asked; see ``TensorCoreProbe``)."""
        self.tpu = tpu or TpuMetricsClient(tpu_address, chips_on_host=chips_on_host)
        self.tensorcore = tensorcore
        self._clock = clock
        self.history: deque[tuple[float, Telemetry]] = deque(maxlen=history)
        self.host: HostMetrics | None = None
        self._host_error = ""
        try:
            self.host = HostMetrics()
        except Exception as error:  # psutil missing or /proc unreadable: say so, keep the TPU side
            self._host_error = f"psutil cannot read this host: {error}"

    def sample(self, processes: Mapping[str, int] | None = None) -> tuple[float, Telemetry]:
        """(wall-clock time, sample); ``processes``: {label: pid} whose resident memory to include."""
        unavailable: dict[str, str] = {}
        # A source's reader is meant to return its reason; one that raises costs that source's values only.
        try:
            chips, reason = self.tpu.read()
        except Exception as error:  # noqa: BLE001 - said in the sample, sampling goes on
            chips, reason = [], f"the TPU metrics reader failed: {type(error).__name__}: {error}"
        if reason:
            unavailable["tpu"] = reason
        elif self.tensorcore is not None:
            try:
                per_core, reason = self.tensorcore.read()
            except Exception as error:  # noqa: BLE001 - said in the sample, sampling goes on
                per_core, reason = [], f"the TensorCore probe failed: {type(error).__name__}: {error}"
            if reason:
                unavailable["tensorcore"] = reason
            add_tensorcore_utilisation(chips, per_core)
        host: dict[str, Any] = {}
        if self.host is not None:
            try:
                host = self.host.read(processes)
            except Exception as error:
                unavailable["host"] = f"psutil failed: {type(error).__name__}: {error}"
        else:
            unavailable["host"] = self._host_error
        stamped = (self._clock(), Telemetry(chips=chips, host=host, unavailable=unavailable))
        self.history.append(stamped)
        return stamped

    def close(self) -> None:
        self.tpu.close()
        if self.tensorcore is not None:
            self.tensorcore.close()


def telemetry_sampler(settings: TelemetrySettings) -> TelemetrySampler:
    """A TelemetrySampler for this host and the configured metrics address."""
    from tpudash.accel.hostcheck import scan_chips

    chips = scan_chips()
    # libtpu's SDK only where it has chips to describe: elsewhere it crashes (see tpudash.telemetry.tensorcore).
    tensorcore = TensorCoreProbe() if chips.count and libtpu_installed() else None
    return TelemetrySampler(
        settings.tpu_metrics, chips_on_host=None if chips.scan_error else chips.count, tensorcore=tensorcore
    )


class SamplingLoop:
    """Samples every ``interval`` seconds until stopped, handing each sample to ``on_sample``.

    ``run`` blocks (a Textual thread worker calls it); ``start`` runs it on a
    daemon thread of its own (the command line). ``processes`` is asked at
    each sample for the {label: pid} whose resident memory to include, and
    ``on_sample`` runs on the sampling thread (a UI posts the sample on, a
    recorder writes it).
    """

    def __init__(
        self,
        sampler: TelemetrySampler,
        interval: float,
        on_sample: Callable[[float, Telemetry], None],
        processes: Callable[[], Mapping[str, int]] = dict,
    ):
        self.sampler = sampler
        self.interval = interval
        self._on_sample = on_sample
        self._processes = processes
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.delivery_failure: str | None = None
        """The last error from ``on_sample`` (said once on stderr), None while every sample was handed on."""

    def run(self) -> None:
        # Fixed deadlines, not a wait after each sample: late wake-ups (the
        # GIL held by training) would otherwise add up to a slower rate.
        deadline = time.monotonic()
        try:
            while not self._stop.is_set():
                self._wake.clear()
                self._sample_once()
                deadline += self.interval
                now = time.monotonic()
                if deadline <= now:  # a slow sample: the next a whole interval on, never a burst
                    deadline = now + self.interval
                if self._wake.wait(deadline - now):
                    deadline = time.monotonic()  # woken to sample at once: the schedule starts again here
        finally:
            self.sampler.close()

    def _sample_once(self) -> None:
        """One sample handed on; whatever fails is said (in the sample, or once on stderr), and the loop goes on."""
        try:
            stamp, sample = self.sampler.sample(self._processes())
        except Exception as error:  # noqa: BLE001 - telemetry never stops without a word
            reason = f"sampling failed: {type(error).__name__}: {error}"
            stamp, sample = time.time(), Telemetry(chips=[], host={}, unavailable={"telemetry": reason})
        try:
            self._on_sample(stamp, sample)
        except Exception as error:  # noqa: BLE001 - a consumer's failure must not end sampling for the others
            if not self.delivery_failure:
                print(f"tpudash: a telemetry sample could not be handed on: {error!r}", file=sys.stderr, flush=True)
            self.delivery_failure = f"{type(error).__name__}: {error}"

    def wake(self) -> None:
        """Sample now rather than at the next interval (a run just started: even a short one gets a sample)."""
        self._wake.set()

    def start(self, name: str = "tpudash-telemetry") -> SamplingLoop:
        self._thread = threading.Thread(target=self.run, name=name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Ask the loop to end; wait for it when ``start`` ran it (a sample in flight has a deadline of its own)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
