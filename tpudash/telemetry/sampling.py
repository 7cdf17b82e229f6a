"""Accelerator and host telemetry: is the TPU busy, and is the host keeping up?

Two sources, both read from the dashboard process without TensorFlow, so
they also observe a TPU held by another process (the user's notebook):

- **TPU**, through tpu-info's client for libtpu's RuntimeMetricService (gRPC,
  ``localhost:8431`` by default, the port libtpu serves while a process
  holds the TPU): per chip duty cycle, HBM used and total, HBM bandwidth
  utilisation; and TensorCore utilisation where libtpu's SDK offers it,
  read in a child process (``TensorCoreProbe``). The channel is local (loopback credentials, as tpu-info's
  own), every call has a deadline, and a failed channel is rebuilt at the
  next sample, so sampling resumes as soon as the service is back.
- **Host**, through psutil: CPU per core, memory, and the resident memory of
  the processes that matter (the engine, a watched run's writer).

A source that gives nothing says why (``unavailable``), in words a user can
act on. A sample is a ``jobs.events.Telemetry`` event; ``TelemetryRecorder``
appends samples to the ``telemetry.jsonl`` of every run that is live while
they are taken, so History replays them beside the run's curves. Loading
this module imports neither TensorFlow nor libtpu (libtpu's in-process SDK
can abort a process when its version does not match).
"""

from __future__ import annotations

import fcntl
import ipaddress
import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from jobs.events import Telemetry, dumps
from tpudash.runs.store import TELEMETRY_FILE

DEFAULT_TPU_METRICS_ADDRESS = "localhost:8431"
RPC_DEADLINE_SECONDS = 0.5
DEFAULT_INTERVAL_SECONDS = 1.0
# 0 turns sampling off; otherwise between these.
INTERVAL_RANGE = (0.1, 60.0)
# Fifteen minutes at the default rate: what the Devices sparklines and the
# idle-accelerator hint look back over, in bounded memory.
HISTORY_SAMPLES = 900
# libtpu's metric names, as tpu-info spells them (tpu_info.metrics.MetricName).
DUTY_CYCLE_METRIC = "tpu.runtime.tensorcore.dutycycle.percent"
HBM_TOTAL_METRIC = "tpu.runtime.hbm.memory.total.bytes"
HBM_USED_METRIC = "tpu.runtime.hbm.memory.usage.bytes"
HBM_BANDWIDTH_METRIC = "tpu.runtime.hbm.utilization.percent"
SERVICE_HINT = "libtpu serves it while a TensorFlow or JAX process holds the TPU"
LOOPBACK_NAMES = ("localhost", "ip6-localhost")
# The accelerator counts as mostly idle below this mean duty cycle, over at
# least IDLE_MIN_SAMPLES samples within IDLE_WINDOW_SECONDS.
IDLE_DUTY_CYCLE_PCT = 50.0
IDLE_WINDOW_SECONDS = 30.0
IDLE_MIN_SAMPLES = 5
INPUT_BOUND_ADVICE = (
    "the input pipeline is the likely bottleneck: end it with .prefetch(tf.data.AUTOTUNE), map with "
    "num_parallel_calls=tf.data.AUTOTUNE, .cache() a dataset that fits in memory, and raise "
    "steps_per_execution in compile() (Cloud TPU performance guide; TensorFlow's tf.data performance guide)"
)


def _grpc():
    """grpc, imported with its C core's info lines silenced: they would land on the dashboard's screen."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    import grpc

    return grpc


class AddressError(ValueError):
    """A TPU metrics address that cannot be used; names what is allowed."""


def parse_metrics_address(text: str) -> str:
    """``HOST:PORT`` of a loopback host, normalised; AddressError otherwise.

    The service is libtpu's on this host and speaks only over loopback
    (local credentials), so a remote host is refused here, not at every sample.
    """
    allowed = "allowed: HOST:PORT on this host, e.g. localhost:8431, 127.0.0.1:8431 or [::1]:8431"
    raw = str(text).strip()
    host, separator, port_text = raw.rpartition(":")
    if not separator or not host:
        raise AddressError(f"{raw!r} has no port; {allowed}")
    try:
        port = int(port_text, 10)
    except ValueError:
        raise AddressError(f"{raw!r}: port {port_text!r} is not a number; {allowed}") from None
    if not 1 <= port <= 65535:
        raise AddressError(f"{raw!r}: port {port} is out of range 1 to 65535; {allowed}")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if bare.lower() not in LOOPBACK_NAMES:
        try:
            loopback = ipaddress.ip_address(bare).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise AddressError(f"{raw!r}: {bare} is not this host; libtpu's metrics service is local-only; {allowed}")
    return f"{host}:{port}"


# -- TPU -----------------------------------------------------------------------------------------


class TpuMetricsClient:
    """libtpu's RuntimeMetricService through tpu-info's gRPC stubs, with deadlines.

    ``chips_on_host``: how many TPU chips the host scan found (None: unknown),
    so a refused connection on a host without chips says that, which is the
    real reason.
    """

    def __init__(self, address: str = DEFAULT_TPU_METRICS_ADDRESS, *, deadline: float = RPC_DEADLINE_SECONDS,
                 chips_on_host: int | None = None):
        self.address = address
        self.deadline = deadline
        self.chips_on_host = chips_on_host
        self._channel = None
        self._stub = None
        self._answered = False
        """The service has answered before: its going away is the news, whatever the PCI scan said."""

    def read(self) -> tuple[list[dict], str | None]:
        """(per-chip values, None) or ([], why nothing could be read)."""
        try:
            grpc = _grpc()
        except ImportError as error:
            return [], f"grpcio is not importable ({error}); pip install tpu-info"
        try:
            stub = self._connect()
            duty = self._values(stub, DUTY_CYCLE_METRIC)
            used = self._values(stub, HBM_USED_METRIC)
            total = self._values(stub, HBM_TOTAL_METRIC)
            bandwidth = self._values(stub, HBM_BANDWIDTH_METRIC, optional=True)
        except grpc.RpcError as error:
            self.close()  # a fresh channel next time: no reconnect backoff to wait out
            return [], self._reason(error)
        except ImportError as error:
            return [], f"tpu-info's gRPC client is not importable ({error}); pip install tpu-info"
        self._answered = True
        if not duty and not used:
            return [], f"the TPU metrics service at {self.address} reports no chips"
        return chips_from_metrics(duty, used, total, bandwidth), None

    def _connect(self):
        if self._stub is None:
            grpc = _grpc()
            from tpu_info.proto import tpu_metric_service_pb2_grpc as service

            # tpu-info's own channel: loopback credentials, as libtpu expects.
            self._channel = grpc.secure_channel(self.address, grpc.local_channel_credentials())
            self._stub = service.RuntimeMetricServiceStub(self._channel)
        return self._stub

    def _values(self, stub, metric_name: str, optional: bool = False) -> dict[int, float]:
        """{device id: value} of one libtpu metric (an optional one libtpu lacks: {})."""
        grpc = _grpc()
        from tpu_info.proto import tpu_metric_service_pb2 as messages

        try:
            response = stub.GetRuntimeMetric(messages.MetricRequest(metric_name=metric_name), timeout=self.deadline)
        except grpc.RpcError as error:
            if optional and error.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED,
                                             grpc.StatusCode.INVALID_ARGUMENT):
                return {}
            raise
        values: dict[int, float] = {}
        for metric in response.metric.metrics:
            gauge = metric.gauge
            kind = gauge.WhichOneof("value")
            value = gauge.as_double if kind == "as_double" else gauge.as_int if kind == "as_int" else None
            if value is not None:
                values[int(metric.attribute.value.int_attr)] = value
        return values

    def _reason(self, error) -> str:
        grpc = _grpc()
        code = error.code()
        details = (error.details() or "").strip()
        if code == grpc.StatusCode.UNAVAILABLE:
            if self.chips_on_host == 0 and not self._answered:
                return f"no TPU chips on this host (and no TPU metrics service at {self.address})"
            cause = "connection refused" if "refused" in details.lower() else (details.split(";")[0] or "unavailable")
            return f"no TPU metrics service at {self.address}: {cause} ({SERVICE_HINT})"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"the TPU metrics service at {self.address} did not answer within {self.deadline:g} s"
        return f"the TPU metrics service at {self.address} answered {code.name}: {details or 'no details'}"

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None


def chips_from_metrics(duty: Mapping[int, float], used: Mapping[int, float], total: Mapping[int, float],
                       bandwidth: Mapping[int, float]) -> list[dict]:
    """Per chip values from libtpu's per-device ones.

    libtpu measures the duty cycle per chip and memory per device (core):
    on chips with two TensorCores (v2, v3) there are twice as many memory
    entries as duty-cycle entries, and a chip's HBM is its cores' sum, as
    tpu-info's table pairs them.
    """
    chip_ids = sorted(duty) or sorted(used)
    devices = sorted(set(used) | set(total))
    per_chip = max(1, len(devices) // len(chip_ids)) if chip_ids and len(devices) % len(chip_ids) == 0 else 1
    chips = []
    for position, chip_id in enumerate(chip_ids):
        cores = devices[position * per_chip:(position + 1) * per_chip] if per_chip > 1 else [chip_id]
        core_bandwidth = [bandwidth[core] for core in cores if core in bandwidth]
        chips.append({
            "chip": int(chip_id),
            "duty_cycle_pct": _number(duty.get(chip_id)),
            "hbm_used": _sum_or_none(used, cores),
            "hbm_total": _sum_or_none(total, cores),
            "hbm_bandwidth_pct": sum(core_bandwidth) / len(core_bandwidth) if core_bandwidth else None,
        })
    return chips


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _sum_or_none(values: Mapping[int, float], keys: Iterable[int]) -> int | None:
    present = [values[key] for key in keys if key in values]
    return int(sum(present)) if present else None


# -- host -----------------------------------------------------------------------------------------


class HostMetrics:
    """CPU per core and memory of this host, and resident memory of named processes (psutil)."""

    def __init__(self):
        import psutil

        self._psutil = psutil
        self._processes: dict[int, object] = {}
        # cpu_percent measures since its previous call: this call starts the clock.
        psutil.cpu_percent(percpu=True)

    def read(self, processes: Mapping[str, int] | None = None) -> dict:
        psutil = self._psutil
        memory = psutil.virtual_memory()
        host = {
            "cpu_pct": [round(value, 1) for value in psutil.cpu_percent(percpu=True)],
            # What nvitop and top call used: everything not available to a new process.
            "memory_used": int(memory.total - memory.available),
            "memory_total": int(memory.total),
            "processes": {},
        }
        for label, pid in (processes or {}).items():
            rss = self._resident_bytes(pid)
            if rss is not None:
                host["processes"][label] = rss
        return host

    def _resident_bytes(self, pid: int) -> int | None:
        psutil = self._psutil
        try:
            process = self._processes.get(pid)
            if process is None:
                process = self._processes[pid] = psutil.Process(pid)
            return int(process.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError):
            self._processes.pop(pid, None)
            return None


# -- sampling -------------------------------------------------------------------------------------


class TelemetrySampler:
    """Takes one ``Telemetry`` sample of both sources on request, and keeps a bounded history."""

    def __init__(self, tpu_address: str = DEFAULT_TPU_METRICS_ADDRESS, *, chips_on_host: int | None = None,
                 history: int = HISTORY_SAMPLES, clock: Callable[[], float] = time.time,
                 tpu: TpuMetricsClient | None = None, tensorcore: "TensorCoreProbe | None" = None):
        """``tensorcore``: where TensorCore utilisation comes from (None: not asked; see ``TensorCoreProbe``)."""
        self.tpu = tpu or TpuMetricsClient(tpu_address, chips_on_host=chips_on_host)
        self.tensorcore = tensorcore
        self._clock = clock
        self.history: deque[tuple[float, Telemetry]] = deque(maxlen=history)
        try:
            self.host: HostMetrics | None = HostMetrics()
            self._host_error = None
        except Exception as error:  # psutil missing or /proc unreadable: say so, keep the TPU side
            self.host, self._host_error = None, f"psutil cannot read this host: {error}"

    def sample(self, processes: Mapping[str, int] | None = None) -> tuple[float, Telemetry]:
        """(wall-clock time, sample); ``processes``: {label: pid} whose resident memory to include."""
        unavailable: dict[str, str] = {}
        chips, reason = self.tpu.read()
        if reason:
            unavailable["tpu"] = reason
        elif self.tensorcore is not None:
            per_core, reason = self.tensorcore.read()
            if reason:
                unavailable["tensorcore"] = reason
            add_tensorcore_utilisation(chips, per_core)
        host: dict = {}
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


class SamplingLoop:
    """Samples every ``interval`` seconds until stopped, handing each sample to ``on_sample``.

    ``run`` blocks (a Textual thread worker calls it); ``start`` runs it on a
    daemon thread of its own (the command line). ``processes`` is asked at
    each sample for the {label: pid} whose resident memory to include, and
    ``on_sample`` runs on the sampling thread (a UI posts the sample on, a
    recorder writes it).
    """

    def __init__(self, sampler: TelemetrySampler, interval: float, on_sample: Callable[[float, Telemetry], None],
                 processes: Callable[[], Mapping[str, int]] = dict):
        self.sampler = sampler
        self.interval = interval
        self._on_sample = on_sample
        self._processes = processes
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        # Fixed deadlines, not a wait after each sample: late wake-ups (the
        # GIL held by training) would otherwise add up to a slower rate.
        deadline = time.monotonic()
        try:
            while not self._stop.is_set():
                self._wake.clear()
                stamp, sample = self.sampler.sample(self._processes())
                self._on_sample(stamp, sample)
                deadline += self.interval
                now = time.monotonic()
                if deadline <= now:  # a slow sample: the next a whole interval on, never a burst
                    deadline = now + self.interval
                if self._wake.wait(deadline - now):
                    deadline = time.monotonic()  # woken to sample at once: the schedule starts again here
        finally:
            self.sampler.close()

    def wake(self) -> None:
        """Sample now rather than at the next interval (a run just started: even a short one gets a sample)."""
        self._wake.set()

    def start(self, name: str = "tpudash-telemetry") -> "SamplingLoop":
        self._thread = threading.Thread(target=self.run, name=name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Ask the loop to end; wait for it when ``start`` ran it (a sample in flight has a deadline of its own)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)


# -- recording -----------------------------------------------------------------------------------


class TelemetryRecorder:
    """Appends samples to the telemetry.jsonl of each live run.

    Several observers may watch one run (the dashboard and ``tpudash watch``):
    the first to take the file's lock records, the others leave it alone, so
    a run never gets every sample twice. A run's file is closed, and its lock
    given up, once the run is no longer among the live ones.
    """

    def __init__(self):
        self._files: dict[Path, Any] = {}
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

    def _open(self, run_dir: Path):
        try:
            handle = open(run_dir / TELEMETRY_FILE, "ab")
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


# -- what the samples say ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """The few numbers a plot line or a status line needs from one sample (None: not measured)."""

    duty_cycle_pct: float | None
    hbm_used_pct: float | None
    hbm_bandwidth_pct: float | None
    cpu_pct: float | None
    memory_used_pct: float | None


def summarize(sample: Telemetry) -> Summary:
    """Mean duty cycle over chips, HBM used of all chips' total, mean host CPU, host memory used."""
    duties = [chip["duty_cycle_pct"] for chip in sample.chips if _number(chip.get("duty_cycle_pct")) is not None]
    bandwidths = [chip["hbm_bandwidth_pct"] for chip in sample.chips
                  if _number(chip.get("hbm_bandwidth_pct")) is not None]
    used = sum(chip.get("hbm_used") or 0 for chip in sample.chips)
    total = sum(chip.get("hbm_total") or 0 for chip in sample.chips)
    cores = [value for value in sample.host.get("cpu_pct") or [] if _number(value) is not None]
    memory_total = sample.host.get("memory_total") or 0
    return Summary(
        duty_cycle_pct=sum(duties) / len(duties) if duties else None,
        hbm_used_pct=100.0 * used / total if total else None,
        hbm_bandwidth_pct=sum(bandwidths) / len(bandwidths) if bandwidths else None,
        cpu_pct=sum(cores) / len(cores) if cores else None,
        memory_used_pct=100.0 * (sample.host.get("memory_used") or 0) / memory_total if memory_total else None,
    )


def idle_accelerator_hint(samples: Iterable[tuple[float, Telemetry]], now: float,
                          window: float = IDLE_WINDOW_SECONDS) -> str | None:
    """Advice when the TPU was mostly idle over the last ``window`` seconds of samples, else None.

    Call it only while a run is training: an idle TPU between runs is expected.
    """
    duties = [summary.duty_cycle_pct for stamp, sample in samples if now - stamp <= window
              for summary in (summarize(sample),) if summary.duty_cycle_pct is not None]
    if len(duties) < IDLE_MIN_SAMPLES:
        return None
    mean = sum(duties) / len(duties)
    if mean >= IDLE_DUTY_CYCLE_PCT:
        return None
    return f"the TPU was busy {mean:.0f}% of the last {window:.0f} s while training: {INPUT_BOUND_ADVICE}"


def scalars(sample: Telemetry) -> dict[str, float]:
    """A sample as named numbers, for CSV export and plots: ``tpu0_duty_cycle_pct``, ``host_cpu_pct``…"""
    values: dict[str, float] = {}
    for chip in sample.chips:
        for key in ("duty_cycle_pct", "hbm_used", "hbm_total", "hbm_bandwidth_pct", "tensorcore_util_pct"):
            value = _number(chip.get(key))
            if value is not None:
                values[f"tpu{chip.get('chip')}_{key}"] = value
    summary = summarize(sample)
    if summary.cpu_pct is not None:
        values["host_cpu_pct"] = summary.cpu_pct
    for key in ("memory_used", "memory_total"):
        value = _number(sample.host.get(key))
        if value is not None:
            values[f"host_{key}"] = value
    for label, rss in (sample.host.get("processes") or {}).items():
        if _number(rss) is not None:
            values[f"{label}_rss"] = float(rss)
    return values


# -- TensorCore utilisation: libtpu's in-process SDK, in a child process ----------------------------

TENSORCORE_PROBE_DEADLINE_SECONDS = 2.0


def libtpu_installed() -> bool:
    """libtpu is importable (found without importing it: importing it is what can abort)."""
    import importlib.util

    return importlib.util.find_spec("libtpu") is not None


class TensorCoreProbe:
    """TensorCore utilisation per core from libtpu's SDK (``sdk.monitoring.get_metric("tensorcore_util")``).

    The SDK works only inside the importing process, and libtpu can abort or
    crash that process (measured: on a host without its runtime agent,
    libtpu 0.0.17's ``get_metric`` raises RuntimeError, then the process dies
    of SIGSEGV at exit; a libtpu that does not match aborts at import). So a
    child process does it
    (``python -m tpudash.telemetry.sampling --tensorcore-probe``), answering one JSON
    line per request; when it dies the reason names the signal, and it is not
    started again: it would die the same way.
    """

    def __init__(self, python: str | None = None, environment: Mapping[str, str] | None = None,
                 deadline: float = TENSORCORE_PROBE_DEADLINE_SECONDS):
        import sys

        self._command = [python or sys.executable, "-m", "tpudash.telemetry.sampling", "--tensorcore-probe"]
        self._environment = dict(os.environ if environment is None else environment)
        self.deadline = deadline
        self._process = None
        self.failure: str | None = None
        """Why the probe gave up for good, once it has."""

    def read(self) -> tuple[list[float], str | None]:
        """(utilisation % per core, None) or ([], why not)."""
        import select
        import signal
        import subprocess

        if self.failure:
            return [], self.failure
        if self._process is None:
            self._process = subprocess.Popen(self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=subprocess.DEVNULL, env=self._environment, text=True)
        process = self._process
        try:
            process.stdin.write("read\n")
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], self.deadline)
            line = process.stdout.readline() if ready else None
        except (BrokenPipeError, OSError):
            line = ""
        if line is None:
            return [], f"libtpu's SDK did not answer within {self.deadline:g} s"
        if not line:
            code = process.wait(self.deadline)
            how = f"died with {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
            self.failure = f"libtpu's SDK {how} reading tensorcore_util (kept out of the dashboard's process)"
            self._process = None
            return [], self.failure
        import json

        answer = json.loads(line)
        if "error" in answer:
            return [], f"libtpu's SDK: {answer['error']}"
        return [float(value) for value in answer["values"]], None

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


def add_tensorcore_utilisation(chips: list[dict], per_core: list[float]) -> None:
    """Each chip's mean TensorCore utilisation, from libtpu's per-core values (cores in chip order)."""
    if not chips or not per_core or len(per_core) % len(chips):
        return
    cores_per_chip = len(per_core) // len(chips)
    for position, chip in enumerate(chips):
        cores = per_core[position * cores_per_chip:(position + 1) * cores_per_chip]
        chip["tensorcore_util_pct"] = sum(cores) / len(cores)


def _serve_tensorcore_probe() -> None:
    """The child's side: import libtpu's SDK once, answer each request line with one JSON line."""
    import json
    import sys

    def answer(payload: dict) -> None:
        sys.stdout.write(json.dumps(payload) + "\n")
        sys.stdout.flush()

    try:
        from libtpu import sdk
        monitoring = getattr(sdk, "tpumonitoring", None) or getattr(sdk, "monitoring")
    except (ImportError, AttributeError) as error:
        monitoring, failure = None, f"not available ({type(error).__name__}: {error})"
    for _ in sys.stdin:
        if monitoring is None:
            answer({"error": failure})
            continue
        try:
            values = monitoring.get_metric("tensorcore_util").data()
            answer({"values": [float(str(value).rstrip("%")) for value in values]})
        except Exception as error:  # an older SDK, no chips: a reason, and the child lives on
            answer({"error": f"{type(error).__name__}: {error}"})


def telemetry_sampler(settings):
    """A TelemetrySampler for this host and the configured metrics address."""
    from tpudash.accel.hostcheck import scan_chips

    chips = scan_chips()
    # libtpu's SDK only where it has chips to describe: elsewhere it crashes (see TensorCoreProbe).
    tensorcore = TensorCoreProbe() if chips.count and libtpu_installed() else None
    return TelemetrySampler(settings.tpu_metrics, chips_on_host=None if chips.scan_error else chips.count,
                            tensorcore=tensorcore)


class RecordingTelemetry:
    """While a run is live under this process (``run``, ``watch``): sample, and record the samples with the run.

    ``run_dir`` is set by the caller (``watch``), or by this object as a
    runner sink when the run starts (``run``). Nothing is sampled when
    ``--telemetry-interval`` is 0.
    """

    def __init__(self, settings, processes: dict[str, int]):
        self.run_dir: Path | None = None
        self.recorder = TelemetryRecorder()
        self.loop = None
        if settings.telemetry_interval:
            self.loop = SamplingLoop(telemetry_sampler(settings), settings.telemetry_interval, self._record,
                                     processes=lambda: processes)

    def _record(self, stamp, sample) -> None:
        if self.run_dir is not None:
            self.recorder.record(stamp, sample, [self.run_dir])

    def __call__(self, run, event, timestamp=None) -> None:
        """A runner sink: the run's directory exists once it has started; sample it at once."""
        from jobs.events import RunStarted

        if isinstance(event, RunStarted) and run is not None and run.run_dir is not None:
            self.run_dir = run.run_dir
            if self.loop is not None:
                self.loop.wake()

    def __enter__(self) -> "RecordingTelemetry":
        if self.loop is not None:
            self.loop.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.loop is not None:
            self.loop.stop()
        self.recorder.close()



if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--tensorcore-probe"]:
        _serve_tensorcore_probe()
