"""A fake libtpu RuntimeMetricService on 127.0.0.1, serving scripted values.

Built on tpu-info's own generated servicer and messages, with loopback
credentials as libtpu's, so tpudash's client talks to it exactly as to
libtpu. ``FakeTpuMetrics(chips=4, cores_per_chip=1)`` serves per-chip duty
cycle and per-core HBM; ``set`` changes the values, ``stop`` and ``start``
take the service away and bring it back on the same port; after
``hold_answers`` a call stays in flight until ``stop``. Run as a script
(``python -m tests.fake_tpu_metrics PORT``) it serves until killed, for a
process under test that is not this one.
"""

from __future__ import annotations

import sys
import threading
from concurrent import futures

import grpc
from tpu_info.proto import tpu_metric_service_pb2 as messages
from tpu_info.proto import tpu_metric_service_pb2_grpc as service

from tpudash.telemetry.sources import DUTY_CYCLE_METRIC, HBM_BANDWIDTH_METRIC, HBM_TOTAL_METRIC, HBM_USED_METRIC

GIB = 1024**3


class _Servicer(service.RuntimeMetricServiceServicer):
    def __init__(self, fake: FakeTpuMetrics):
        self.fake = fake

    def GetRuntimeMetric(self, request, context):
        with self.fake.lock:
            self.fake.requests.append(request.metric_name)
            values = self.fake.values.get(request.metric_name)
        self.fake.call_arrived.set()
        self.fake.answering.wait(timeout=60)  # held (hold_answers): the call stays in flight until stop()
        if values is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"metric {request.metric_name} not found")
        metrics = []
        for device_id, value in sorted(values.items()):
            gauge = messages.Gauge(as_double=value) if isinstance(value, float) else messages.Gauge(as_int=value)
            metrics.append(
                messages.Metric(
                    attribute=messages.Attribute(key="device-id", value=messages.AttrValue(int_attr=device_id)),
                    gauge=gauge,
                )
            )
        return messages.MetricResponse(metric=messages.TPUMetric(name=request.metric_name, metrics=metrics))


class FakeTpuMetrics:
    """A scripted RuntimeMetricService; see the module docstring."""

    def __init__(self, chips: int = 4, cores_per_chip: int = 1, hbm_total: int = 16 * GIB, port: int = 0):
        self.lock = threading.Lock()
        self.requests: list[str] = []
        self.values: dict[str, dict[int, float | int]] = {}
        self.chips, self.cores_per_chip = chips, cores_per_chip
        self.port = port
        self._server = None
        self.call_arrived = threading.Event()
        self.answering = threading.Event()
        self.answering.set()
        devices = range(chips * cores_per_chip)
        self.set(
            duty={chip: 0.0 for chip in range(chips)},
            used={device: 0 for device in devices},
            total={device: hbm_total for device in devices},
            bandwidth={device: 0.0 for device in devices},
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set(self, duty=None, used=None, total=None, bandwidth=None, drop_bandwidth: bool = False) -> None:
        """Serve these values from now on ({device or chip id: value}); ``drop_bandwidth``: as an older libtpu."""
        with self.lock:
            for metric, values in (
                (DUTY_CYCLE_METRIC, duty),
                (HBM_USED_METRIC, used),
                (HBM_TOTAL_METRIC, total),
                (HBM_BANDWIDTH_METRIC, bandwidth),
            ):
                if values is not None:
                    self.values[metric] = {
                        int(key): (float(value) if metric in (DUTY_CYCLE_METRIC, HBM_BANDWIDTH_METRIC) else int(value))
                        for key, value in values.items()
                    }
            if drop_bandwidth:
                self.values.pop(HBM_BANDWIDTH_METRIC, None)

    def start(self) -> FakeTpuMetrics:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        service.add_RuntimeMetricServiceServicer_to_server(_Servicer(self), server)
        port = server.add_secure_port(f"127.0.0.1:{self.port}", grpc.local_server_credentials())
        if not port:
            raise RuntimeError(f"cannot listen on 127.0.0.1:{self.port}")
        self.port = port
        server.start()
        self._server = server
        return self

    def hold_answers(self) -> None:
        """Calls from now on wait, in flight, until ``stop()``: a service that goes away mid-call."""
        self.call_arrived.clear()
        self.answering.clear()

    def stop(self) -> None:
        if self._server is not None:
            stopped = self._server.stop(grace=None)  # calls in flight are cancelled
            self.answering.set()
            stopped.wait()
            self._server = None

    def __enter__(self) -> FakeTpuMetrics:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    fake = FakeTpuMetrics(port=int(sys.argv[1]) if len(sys.argv) > 1 else 0).start()
    fake.set(
        duty={0: 87.5, 1: 62.5, 2: 25.0, 3: 12.5},
        used={0: 4 * GIB, 1: 2 * GIB, 2: GIB, 3: 0},
        bandwidth={0: 40.0, 1: 30.0, 2: 20.0, 3: 10.0},
    )
    print(fake.address, flush=True)
    threading.Event().wait()
