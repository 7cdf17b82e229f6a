"""Where telemetry values come from: libtpu's metrics service (gRPC) and this host (psutil), as plain values.

Both are read from the dashboard's own process without TensorFlow, so they
also observe a TPU held by another process (the user's notebook):

- **TPU**, through tpu-info's client for libtpu's RuntimeMetricService (gRPC,
  ``localhost:8431`` by default, the port libtpu serves while a process
  holds the TPU): per chip duty cycle, HBM used and total, HBM bandwidth
  utilisation. The channel is local (loopback credentials, as tpu-info's
  own), every call has a deadline, and a failed channel is rebuilt at the
  next read, so reading resumes as soon as the service is back.
- **Host**, through psutil: CPU per core, memory, and the resident memory of
  the processes that matter (the engine, a watched run's writer).

A source that gives nothing says why, in words a user can act on.
TensorCore utilisation, which needs libtpu's in-process SDK, is read in a
child process: ``tpudash.telemetry.tensorcore``.

Light on purpose: ``tpudash.config`` imports the address rules from here,
so this module imports neither grpc, psutil nor the event protocol
(``jobs.events``, msgspec) until a read, and nothing of ``tpudash.runs``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tpudash.net import is_loopback_host

if TYPE_CHECKING:
    import psutil

DEFAULT_TPU_METRICS_ADDRESS = "localhost:8431"
RPC_DEADLINE_SECONDS = 0.5
NO_CHIPS_RETRY_SECONDS = 30.0
"""How often a host without TPU chips asks again for a metrics service that refused."""
# libtpu's metric names, as tpu-info spells them (tpu_info.metrics.MetricName).
DUTY_CYCLE_METRIC = "tpu.runtime.tensorcore.dutycycle.percent"
HBM_TOTAL_METRIC = "tpu.runtime.hbm.memory.total.bytes"
HBM_USED_METRIC = "tpu.runtime.hbm.memory.usage.bytes"
HBM_BANDWIDTH_METRIC = "tpu.runtime.hbm.utilization.percent"
SERVICE_HINT = "libtpu serves it while a TensorFlow or JAX process holds the TPU"

Chip = dict[str, Any]
"""One chip's values in a ``jobs.events.Telemetry`` sample: ``chip``, ``duty_cycle_pct``, ``hbm_used``…"""


def _grpc() -> ModuleType:
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
    if not is_loopback_host(bare):
        raise AddressError(f"{raw!r}: {bare} is not this host; libtpu's metrics service is local-only; {allowed}")
    return f"{host}:{port}"


# -- TPU -----------------------------------------------------------------------------------------


class TpuMetricsClient:
    """libtpu's RuntimeMetricService through tpu-info's gRPC stubs, with deadlines.

    ``chips_on_host``: how many TPU chips the host scan found (None: unknown),
    so a refused connection on a host without chips says that, which is the
    real reason. On such a host the service is asked again only every
    ``NO_CHIPS_RETRY_SECONDS`` while it refuses: a new channel and a refused
    call each second were most of a sample's CPU (1 of 1.5 ms), taken from
    the training the dashboard shows, for an answer that cannot change.
    """

    def __init__(
        self,
        address: str = DEFAULT_TPU_METRICS_ADDRESS,
        *,
        deadline: float = RPC_DEADLINE_SECONDS,
        chips_on_host: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.address = address
        self.deadline = deadline
        self.chips_on_host = chips_on_host
        self._clock = clock
        self._refused: tuple[float, str] | None = None
        """When a chipless host's service last refused, and the reason given then."""
        # grpc and tpu-info ship no types: the channel and the stub are theirs.
        self._channel: Any = None
        self._stub: Any = None
        self._answered = False
        """The service has answered before: its going away is the news, whatever the PCI scan said."""

    def read(self) -> tuple[list[Chip], str | None]:
        """(per-chip values, None) or ([], why nothing could be read)."""
        if self._refused is not None and self._clock() - self._refused[0] < NO_CHIPS_RETRY_SECONDS:
            return [], self._refused[1]
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
            reason = self._reason(error)
            if self.chips_on_host == 0 and not self._answered and error.code() == grpc.StatusCode.UNAVAILABLE:
                self._refused = (self._clock(), reason)
            return [], reason
        except ImportError as error:
            return [], f"tpu-info's gRPC client is not importable ({error}); pip install tpu-info"
        self._answered = True
        self._refused = None
        if not duty and not used:
            return [], f"the TPU metrics service at {self.address} reports no chips"
        return chips_from_metrics(duty, used, total, bandwidth), None

    def _connect(self) -> Any:
        if self._stub is None:
            grpc = _grpc()
            from tpu_info.proto import tpu_metric_service_pb2_grpc as service

            # tpu-info's own channel: loopback credentials, as libtpu expects.
            self._channel = grpc.secure_channel(self.address, grpc.local_channel_credentials())
            self._stub = service.RuntimeMetricServiceStub(self._channel)
        return self._stub

    def _values(self, stub: Any, metric_name: str, optional: bool = False) -> dict[int, float]:
        """{device id: value} of one libtpu metric (an optional one libtpu lacks: {})."""
        grpc = _grpc()
        from tpu_info.proto import tpu_metric_service_pb2 as messages

        try:
            response = stub.GetRuntimeMetric(messages.MetricRequest(metric_name=metric_name), timeout=self.deadline)
        except grpc.RpcError as error:
            missing = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INVALID_ARGUMENT)
            if optional and error.code() in missing:
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

    def _reason(self, error: Any) -> str:
        grpc = _grpc()
        code = error.code()
        details = (error.details() or "").strip()
        if code == grpc.StatusCode.UNAVAILABLE:
            if self.chips_on_host == 0 and not self._answered:
                return f"no TPU chips on this host (and no TPU metrics service at {self.address})"
            cause = details.split(";")[0] or "unavailable"
            if "refused" in details.lower():
                cause = "connection refused"
            elif "cancelling all calls" in details.lower():  # gRPC's word for a server shut down mid-call
                cause = "it stopped while answering"
            return f"no TPU metrics service at {self.address}: {cause} ({SERVICE_HINT})"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"the TPU metrics service at {self.address} did not answer within {self.deadline:g} s"
        return f"the TPU metrics service at {self.address} answered {code.name}: {details or 'no details'}"

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None


def chips_from_metrics(
    duty: Mapping[int, float], used: Mapping[int, float], total: Mapping[int, float], bandwidth: Mapping[int, float]
) -> list[Chip]:
    """Per chip values from libtpu's per-device ones.

    libtpu measures the duty cycle per chip and memory per device (core):
    on chips with two TensorCores (v2, v3) there are twice as many memory
    entries as duty-cycle entries, and a chip's HBM is its cores' sum, as
    tpu-info's table pairs them.
    """
    from jobs.events import is_finite_number  # msgspec with it: tpudash.config (the first frame) imports this module

    chip_ids = sorted(duty) or sorted(used)
    devices = sorted(set(used) | set(total))
    per_chip = max(1, len(devices) // len(chip_ids)) if chip_ids and len(devices) % len(chip_ids) == 0 else 1
    chips = []
    for position, chip_id in enumerate(chip_ids):
        cores = devices[position * per_chip : (position + 1) * per_chip] if per_chip > 1 else [chip_id]
        core_bandwidth = [bandwidth[core] for core in cores if core in bandwidth]
        chips.append(
            {
                "chip": int(chip_id),
                "duty_cycle_pct": float(duty[chip_id]) if is_finite_number(duty.get(chip_id)) else None,
                "hbm_used": _sum_or_none(used, cores),
                "hbm_total": _sum_or_none(total, cores),
                "hbm_bandwidth_pct": sum(core_bandwidth) / len(core_bandwidth) if core_bandwidth else None,
            }
        )
    return chips


def _sum_or_none(values: Mapping[int, float], keys: Iterable[int]) -> int | None:
    present = [values[key] for key in keys if key in values]
    return int(sum(present)) if present else None


# -- host -----------------------------------------------------------------------------------------


class HostMetrics:
    """CPU per core and memory of this host, and resident memory of named processes (psutil)."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._processes: dict[int, psutil.Process] = {}
        # cpu_percent measures since its previous call: this call starts the clock.
        psutil.cpu_percent(percpu=True)

    def read(self, processes: Mapping[str, int] | None = None) -> dict[str, Any]:
        psutil = self._psutil
        memory = psutil.virtual_memory()
        resident: dict[str, int] = {}
        host = {
            "cpu_pct": [round(value, 1) for value in psutil.cpu_percent(percpu=True)],
            # What nvitop and top call used: everything not available to a new process.
            "memory_used": int(memory.total - memory.available),
            "memory_total": int(memory.total),
            "processes": resident,
        }
        for label, pid in (processes or {}).items():
            rss = self._resident_bytes(pid)
            if rss is not None:
                resident[label] = rss
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
