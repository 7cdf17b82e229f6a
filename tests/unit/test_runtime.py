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

from tpudash.accel.hostcheck import Chips, HostCheck, diagnose
from tpudash.accel.runtime import detect, parse_device_name, tpu_request
from tpudash.accel.startup import RuntimeSetupError, TpuFallback

V4_CHIPS = Chips(chip_type="TPU v4 chip", count=4, hbm_gib_per_chip=32, cores_per_chip=1)
NO_CHIPS = Chips()


def host(chips: Chips = NO_CHIPS, **distributions: str) -> HostCheck:
    """A host scan result: these chips, these distributions (default: the CPU build), real diagnoses."""
    installed = {
        name.replace("_", "-"): version for name, version in (distributions or {"tensorflow": "2.21.0"}).items()
    }
    return HostCheck(
        chips=chips, distributions=installed, tensorflow_found=True, diagnoses=diagnose(chips, installed, [])
    )


TPU_BUILD_HOST = host(V4_CHIPS, tensorflow_tpu="2.20.0", libtpu="0.0.17")

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
    runtime = detect(tpu="grpc://10.0.0.2:8470", environ={}, host=host(), tf=tf)
    assert [call[0] for call in tf.calls] == ["resolver", "connect", "initialize"]
    description = runtime.description
    assert (description.kind, description.strategy, description.num_replicas) == ("TPU", "TPUStrategy", 8)
    topology = description.topology
    assert (topology["mesh_shape"], topology["num_tasks"], topology["num_tpus_per_task"]) == ([2, 2, 1, 2], 1, 8)
    # A v3-8 board: one host, 4 chips of 2 cores (the mesh's last dimension).
    assert description.topology_text() == "1 host × 4 chips (4 chips, 2 cores each), mesh [2, 2, 1, 2]"
    assert description.tpu_address == "grpc://10.0.0.2:8470"
    assert [device.index for device in description.devices] == list(range(8))
    assert description.devices[3].job == "worker" and description.devices[3].task == 0
    assert description.devices[0].memory == {"current": 1024, "peak": 2048}
    assert description.simulated is False


def test_explicit_tpu_that_fails_is_an_error_with_the_resolvers_message_not_a_fallback():
    tf = FakeTensorFlow(resolver_error=ValueError("Could not find TPU my-tpu in zone us-central1-b"))
    with pytest.raises(RuntimeSetupError, match="Could not find TPU my-tpu in zone us-central1-b"):
        detect(tpu="my-tpu", environ={}, host=host(), tf=tf)


def test_explicit_tpu_whose_initialization_fails_names_the_tpu():
    tf = FakeTensorFlow(initialize_error=RuntimeError("TPUs not found in the cluster\nmore detail"))
    with pytest.raises(
        RuntimeSetupError, match=r"initializing TPU 'local' failed: RuntimeError: TPUs not found in the cluster$"
    ):
        detect(tpu="local", environ={}, host=TPU_BUILD_HOST, tf=tf)
    assert ("connect", "local") not in tf.calls  # a TPU VM is initialized without a remote connect


def test_a_tpu_that_never_answers_times_out():
    tf = FakeTensorFlow(hang=True)
    try:
        with pytest.raises(RuntimeSetupError, match="did not answer within 1 s"):
            detect(tpu="grpc://10.0.0.9:8470", environ={}, host=host(), tf=tf, tpu_timeout=1)
    finally:
        tf.release()


def test_automatic_tpu_that_fails_asks_for_the_cpu_default_in_a_fresh_process_with_the_reason():
    tf = FakeTensorFlow(initialize_error=RuntimeError("TPUs not found"))
    with pytest.raises(TpuFallback) as failure:
        detect(environ={"COLAB_TPU_ADDR": "10.1.2.3:8470"}, host=host(), tf=tf, cpu_devices=4)
    assert failure.value.reason.startswith("COLAB_TPU_ADDR=10.1.2.3:8470, but initializing TPU")
    assert ("resolver", "grpc://10.1.2.3:8470") in tf.calls
    # The fresh process gets the CPU default and says why not TPU.
    runtime = detect(
        tpu="none",
        environ={"TPUDASH_TPU_FALLBACK_REASON": failure.value.reason},
        host=host(),
        tf=FakeTensorFlow(),
        cpu_devices=4,
    )
    assert (runtime.description.kind, runtime.description.num_replicas) == ("CPU", 4)
    assert runtime.description.reasons["TPU"] == failure.value.reason


def test_gpus_come_before_the_cpu_split():
    runtime = detect(environ={}, host=host(), tf=FakeTensorFlow(gpus=2))
    assert (runtime.description.kind, runtime.description.strategy) == ("GPU", "MirroredStrategy")
    assert runtime.description.reasons["TPU"].startswith("no --tpu flag")


@pytest.mark.parametrize(
    ("flag", "environ", "chips", "expected", "reason"),
    [
        ("local", {"TPU_NAME": "x"}, V4_CHIPS, ("local", True), "--tpu local given"),
        ("local", {}, Chips(), (None, True), "--tpu local given, but the chip scan finds no TPU chip"),
        ("none", {"TPU_NAME": "x"}, V4_CHIPS, (None, True), "--tpu none given"),
        ("grpc://10.0.0.1:8470", {}, Chips(), ("grpc://10.0.0.1:8470", True), "--tpu grpc://10.0.0.1:8470 given"),
        (None, {"COLAB_TPU_ADDR": "10.0.0.1:8470"}, Chips(), ("grpc://10.0.0.1:8470", False), "COLAB_TPU_ADDR="),
        (None, {"TPU_NAME": "my-tpu"}, Chips(), ("", False), "TPU_NAME=my-tpu"),
        (None, {"TPU_NAME": "local"}, Chips(), (None, False), "TPU_NAME=local, but the chip scan finds no TPU chip"),
        (None, {}, V4_CHIPS, ("local", False), "the chip scan finds 4 × TPU v4 chip, 32 GiB HBM each"),
        (None, {}, Chips(), (None, False), "no TPU chip on the PCI bus"),
        (None, {}, Chips(scan_error="tpu-info is not importable"), (None, False), "tpu-info is not importable"),
    ],
)
def test_which_tpu_to_try(flag, environ, chips, expected, reason):
    argument, explicit, why = tpu_request(flag, environ, chips)
    assert (argument, explicit) == expected
    assert reason in why


def test_device_names_are_parsed_into_job_replica_task_and_index():
    assert parse_device_name("/job:worker/replica:0/task:1/device:TPU:7") == {
        "job": "worker",
        "replica": 0,
        "task": 1,
        "device_type": "TPU",
        "index": 7,
    }
    assert parse_device_name("/device:CPU:3") == {"device_type": "CPU", "index": 3}


def test_the_cpu_default_is_eight_simulated_replicas(runtime):
    description = runtime.description
    assert (description.kind, description.strategy, description.num_replicas) == ("CPU", "MirroredStrategy", 8)
    assert description.simulated
    assert [device.name for device in description.devices] == [f"/device:CPU:{i}" for i in range(8)]
    assert set(description.reasons) == {"TPU", "GPU"}
    assert runtime.strategy.num_replicas_in_sync == 8


def test_explicit_local_tpu_on_a_host_without_chips_is_refused_before_libtpu_is_asked():
    tf = FakeTensorFlow()
    with pytest.raises(RuntimeSetupError, match=r"--tpu local given, but the chip scan finds no TPU chip .*--tpu none"):
        detect(tpu="local", environ={}, host=host(), tf=tf)
    assert tf.calls == []


def test_the_cpu_build_on_a_tpu_host_is_never_tried_on_the_tpu_and_says_how_to_fix_it():
    tpu_host_with_cpu_build = host(V4_CHIPS, tensorflow="2.21.0")
    tf = FakeTensorFlow()
    runtime = detect(environ={}, host=tpu_host_with_cpu_build, tf=tf, cpu_devices=4)
    assert tf.calls == []  # no resolver: the CPU build would fail with "No OpKernel … ConfigureDistributedTPU"
    assert runtime.description.kind == "CPU"
    reason = runtime.description.reasons["TPU"]
    assert reason.startswith("the chip scan finds 4 × TPU v4 chip")
    assert reason.endswith('pip uninstall -y tensorflow && pip install "tensorflow-tpu==2.20.0" "libtpu==0.0.17"')
    assert runtime.description.host_check["diagnoses"][0]["code"] == "cpu-build-on-tpu-host"
    with pytest.raises(
        RuntimeSetupError, match=r"--tpu local given, but this host has 4 TPU v4 chips but the CPU build"
    ):
        detect(tpu="local", environ={}, host=tpu_host_with_cpu_build, tf=FakeTensorFlow())


def test_a_tpu_held_by_another_process_leaves_jobs_on_the_cpu_default():
    from tpudash.accel.hostcheck import TpuHolder

    holder = TpuHolder(4242, "python3 notebook_kernel.py", ("/dev/accel0",))
    installed = {"tensorflow-tpu": "2.20.0", "libtpu": "0.0.17"}
    held = HostCheck(
        chips=V4_CHIPS,
        distributions=installed,
        holders=[holder],
        tensorflow_found=True,
        diagnoses=diagnose(V4_CHIPS, installed, [holder]),
    )
    tf = FakeTensorFlow()
    runtime = detect(environ={}, host=held, tf=tf, cpu_devices=4)
    assert tf.calls == [] and runtime.description.kind == "CPU"
    assert "held by pid 4242 (python3 notebook_kernel.py)" in runtime.description.reasons["TPU"]
    with pytest.raises(RuntimeSetupError, match="held by pid 4242"):
        detect(tpu="local", environ={}, host=held, tf=FakeTensorFlow())


def test_a_libtpu_mismatch_on_a_tpu_host_refuses_before_tensorflow_is_imported(monkeypatch):
    import tpudash.accel.runtime as runtime_module

    def must_not_import(timeout):
        raise AssertionError("TensorFlow would abort this process")

    monkeypatch.setattr(runtime_module, "import_tensorflow", must_not_import)
    mismatched = host(V4_CHIPS, tensorflow_tpu="2.20.0", libtpu="0.0.52")
    with pytest.raises(RuntimeSetupError, match=r"but libtpu 0.0.52 is installed .*pip install \"libtpu==0.0.17\"$"):
        detect(environ={}, host=mismatched)


def test_without_tensorflow_detection_stops_with_the_install_line():
    from tpudash.accel.startup import TensorFlowMissing

    no_tensorflow = HostCheck(
        chips=Chips(),
        distributions={},
        tensorflow_found=False,
        diagnoses=diagnose(Chips(), {}, [], tensorflow_found=False),
    )
    with pytest.raises(TensorFlowMissing, match=r'pip install "tensorflow>=2.20,<2.22"$'):
        detect(environ={}, host=no_tensorflow)


def test_a_tensorflow_start_up_that_hangs_is_bounded_and_says_what_it_waited_for(tmp_path, monkeypatch):
    import tpudash.accel.runtime as runtime_module
    from tpudash.accel import nativelog
    from tpudash.accel.startup import StartupTimeout

    log = tmp_path / "session.log"
    log.write_text("E0000 cuda_platform.cc:52] failed call to cuInit: written before the import began\n")
    monkeypatch.setattr(nativelog, "_active", nativelog.NativeStderr(log))
    stuck = threading.Event()

    def libtpu_asking_the_metadata_server(name):
        with open(log, "a") as native_log:
            native_log.write(
                "I0000 tpu_api_dlsym_initializer.cc:121] Libtpu path is: .../libtpu.so\n"
                "E0000 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)\n"
                "Failed to get TPU metadata (tpu-env) from instance metadata for variable CHIPS_PER_HOST_BOUNDS: "
                "INTERNAL: Failed to fetch URL after 30 tries\n"
                "=== Source Location Trace: ===\nlearning/45eac/tfrc/runtime/gcp_metadata_utils.cc:93\n"
            )
        stuck.wait(30)

    monkeypatch.delitem(__import__("sys").modules, "tensorflow")
    monkeypatch.setattr(runtime_module.importlib, "import_module", libtpu_asking_the_metadata_server)
    try:
        with pytest.raises(StartupTimeout) as timeout:
            runtime_module.import_tensorflow(1)
    finally:
        stuck.set()
    assert str(timeout.value) == (
        "importing TensorFlow did not answer within 1 s; TensorFlow's last words: Failed to get TPU metadata "
        "(tpu-env) from instance metadata for variable CHIPS_PER_HOST_BOUNDS: INTERNAL: Failed to fetch URL after "
        "30 tries (raise TPUDASH_TPU_TIMEOUT to wait longer)"
    )
