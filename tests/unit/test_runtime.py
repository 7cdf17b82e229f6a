"""Runtime detection: the order, the reasons recorded, and TPU errors that never fall back.

The TPU path is exercised against a stand-in for the ``tensorflow`` module
that follows the documented API (TPUClusterResolver, connect, initialize,
TPUStrategy); the CPU path against the real 8-device runtime.
"""

from __future__ import annotations

import threading
from collections import namedtuple
from types import SimpleNamespace

import pytest

from tpudash.runtime import RuntimeSetupError, detect, parse_device_name, tpu_request

LogicalDevice = namedtuple("LogicalDevice", "name device_type")


class FakeTensorFlow:
    """Just enough of tf for detection: a TPU that works, fails, or hangs."""

    __version__ = "2.21.0"

    def __init__(self, tpu_cores=8, resolver_error=None, initialize_error=None, hang=False, gpus=0):
        self.calls = []
        self._tpu_cores = tpu_cores
        self._hang = threading.Event() if hang else None
        fake = self

        class Resolver:
            def __init__(self, tpu=None):
                fake.calls.append(("resolver", tpu))
                if resolver_error:
                    raise resolver_error
                self.tpu = tpu

            def master(self):
                return self.tpu if self.tpu and self.tpu.startswith("grpc://") else ""

        class Strategy:
            def __init__(self, resolver=None, devices=None):
                self.num_replicas_in_sync = len(devices) if devices else fake._tpu_cores

        TPUStrategy = type("TPUStrategy", (Strategy,), {})
        MirroredStrategy = type("MirroredStrategy", (Strategy,), {})

        def connect(resolver):
            fake.calls.append(("connect", resolver.tpu))
            if fake._hang is not None:
                fake._hang.wait(30)

        def initialize(resolver):
            fake.calls.append(("initialize", resolver.tpu))
            if initialize_error:
                raise initialize_error
            return SimpleNamespace(mesh_shape=[2, 2, 1, 2], num_tasks=1, num_tpus_per_task=8)

        def list_logical_devices(kind):
            if kind == "TPU":
                initialized = any(call[0] == "initialize" for call in fake.calls) and initialize_error is None
                names = [f"/job:worker/replica:0/task:0/device:TPU:{i}" for i in range(tpu_cores)]
                return [LogicalDevice(name, "TPU") for name in names] if initialized else []
            if kind == "CPU":
                return [LogicalDevice(f"/device:CPU:{i}", "CPU") for i in range(fake._cpu_split)]
            if kind == "GPU":
                return [LogicalDevice(f"/device:GPU:{i}", "GPU") for i in range(gpus)]
            return []

        def split(device, configs):
            fake._cpu_split = len(configs)

        def memory(name):
            if "TPU" in name:
                return {"current": 1024, "peak": 2048}
            raise ValueError("CPU does not report memory")

        self._cpu_split = 1
        self.distribute = SimpleNamespace(
            cluster_resolver=SimpleNamespace(TPUClusterResolver=Resolver),
            TPUStrategy=TPUStrategy,
            MirroredStrategy=MirroredStrategy,
        )
        self.tpu = SimpleNamespace(experimental=SimpleNamespace(initialize_tpu_system=initialize))
        self.config = SimpleNamespace(
            experimental_connect_to_cluster=connect,
            list_logical_devices=list_logical_devices,
            list_physical_devices=lambda kind: ["gpu"] * gpus if kind == "GPU" else ["cpu"],
            set_logical_device_configuration=split,
            LogicalDeviceConfiguration=lambda: object(),
            experimental=SimpleNamespace(get_memory_info=memory),
        )

    def release(self):
        if self._hang is not None:
            self._hang.set()


def test_explicit_tpu_connects_initializes_and_describes_the_topology():
    tf = FakeTensorFlow()
    runtime = detect(tpu="grpc://10.0.0.2:8470", environ={}, device_files=[], tf=tf)
    assert [call[0] for call in tf.calls] == ["resolver", "connect", "initialize"]
    description = runtime.description
    assert (description.kind, description.strategy, description.num_replicas) == ("TPU", "TPUStrategy", 8)
    assert description.topology == {"mesh_shape": [2, 2, 1, 2], "num_tasks": 1, "num_tpus_per_task": 8}
    assert description.tpu_address == "grpc://10.0.0.2:8470"
    assert [device.index for device in description.devices] == list(range(8))
    assert description.devices[3].job == "worker" and description.devices[3].task == 0
    assert description.devices[0].memory == {"current": 1024, "peak": 2048}
    assert description.simulated is False


def test_explicit_tpu_that_fails_is_an_error_with_the_resolvers_message_not_a_fallback():
    tf = FakeTensorFlow(resolver_error=ValueError("Could not find TPU my-tpu in zone us-central1-b"))
    with pytest.raises(RuntimeSetupError, match="Could not find TPU my-tpu in zone us-central1-b"):
        detect(tpu="my-tpu", environ={}, device_files=[], tf=tf)


def test_explicit_tpu_whose_initialization_fails_names_the_tpu():
    tf = FakeTensorFlow(initialize_error=RuntimeError("TPUs not found in the cluster\nmore detail"))
    with pytest.raises(RuntimeSetupError, match=r"initializing TPU 'local' failed: RuntimeError: TPUs not found in the cluster$"):
        detect(tpu="local", environ={}, device_files=[], tf=tf)
    assert ("connect", "local") not in tf.calls  # a TPU VM is initialized without a remote connect


def test_a_tpu_that_never_answers_times_out():
    tf = FakeTensorFlow(hang=True)
    try:
        with pytest.raises(RuntimeSetupError, match="did not answer within 1 s"):
            detect(tpu="grpc://10.0.0.9:8470", environ={}, device_files=[], tf=tf, tpu_timeout=1)
    finally:
        tf.release()


def test_automatic_tpu_that_fails_falls_through_to_cpu_with_the_reason_recorded():
    tf = FakeTensorFlow(initialize_error=RuntimeError("TPUs not found"))
    runtime = detect(environ={"COLAB_TPU_ADDR": "10.1.2.3:8470"}, device_files=[], tf=tf, cpu_devices=4)
    assert runtime.description.kind == "CPU"
    assert "COLAB_TPU_ADDR=10.1.2.3:8470, but initializing TPU" in runtime.description.reasons["TPU"]
    assert ("resolver", "grpc://10.1.2.3:8470") in tf.calls


def test_gpus_come_before_the_cpu_split():
    runtime = detect(environ={}, device_files=[], tf=FakeTensorFlow(gpus=2))
    assert (runtime.description.kind, runtime.description.strategy) == ("GPU", "MirroredStrategy")
    assert runtime.description.reasons["TPU"].startswith("no --tpu flag")


@pytest.mark.parametrize(
    ("flag", "environ", "files", "expected"),
    [
        ("local", {"TPU_NAME": "x"}, [], ("local", True)),
        (None, {"COLAB_TPU_ADDR": "10.0.0.1:8470"}, [], ("grpc://10.0.0.1:8470", False)),
        (None, {"TPU_NAME": "my-tpu"}, [], ("", False)),
        (None, {}, ["/dev/accel0"], ("local", False)),
        (None, {}, [], (None, False)),
    ],
)
def test_which_tpu_to_try(flag, environ, files, expected):
    argument, explicit, reason = tpu_request(flag, environ, files)
    assert (argument, explicit) == expected
    assert reason


def test_device_names_are_parsed_into_job_replica_task_and_index():
    assert parse_device_name("/job:worker/replica:0/task:1/device:TPU:7") == {
        "job": "worker", "replica": 0, "task": 1, "device_type": "TPU", "index": 7,
    }
    assert parse_device_name("/device:CPU:3") == {"device_type": "CPU", "index": 3}


def test_the_cpu_default_is_eight_simulated_replicas(runtime):
    description = runtime.description
    assert (description.kind, description.strategy, description.num_replicas) == ("CPU", "MirroredStrategy", 8)
    assert description.simulated
    assert [device.name for device in description.devices] == [f"/device:CPU:{i}" for i in range(8)]
    assert set(description.reasons) == {"TPU", "GPU"}
    assert runtime.strategy.num_replicas_in_sync == 8
